// Admission tokens (docs/protocol.md section 3), minted as the waiting room does and exactly
// as the server verifies them:
//
//   payload = "v1|" kid "|" sku "|" user "|" expires_at_ms
//   token   = base64url(payload) "." base64url(HMAC-SHA256(secret_of(kid), payload))
//
// base64url unpadded (Node's 'base64url' encoding is RFC 4648 section 5 without padding).
// The secret file holds one `<kid> <secret as hex>` per line (`#` comments and blank lines
// skipped); the first line's key signs, every line's key verifies on the server.

import { createHmac } from 'node:crypto';
import { readFileSync } from 'node:fs';

const SKU_RE = /^[A-Za-z0-9_.:-]{1,64}$/;
// Printable ASCII 0x21-0x7e except | { }.
const USER_RE = /^[\x21-\x7a\x7e]{1,128}$/;
const HEX_RE = /^(?:[0-9a-fA-F]{2})+$/;
const MIN_SECRET_BYTES = 32;
const MAX_EXPIRY = 9999999999999999999n; // 19 digits

/** A secret file that does not parse as the server parses it. */
export class SecretFileError extends Error {
  constructor(message) {
    super(message);
    this.name = 'SecretFileError';
  }
}

/** Whether `s` is a valid sku (also the kid alphabet). */
export function isValidSku(s) {
  return typeof s === 'string' && SKU_RE.test(s);
}

/** Whether `s` is a valid user or request id. */
export function isValidUser(s) {
  return typeof s === 'string' && USER_RE.test(s) && !s.includes('|');
}

/**
 * Parses a secret file's text with the server's rules (`Keyring::parse`).
 * @param {string} text
 * @returns {{ kid: string, secret: Buffer }[]}
 */
export function parseSecretFile(text) {
  const keys = [];
  String(text)
    .split('\n')
    .forEach((raw, i) => {
      const n = i + 1;
      const line = raw.trim();
      if (line === '' || line.startsWith('#')) return;
      const parts = line.split(/\s+/);
      if (parts.length !== 2) {
        throw new SecretFileError(`line ${n}: expected \`<kid> <secret as hex>\``);
      }
      const [kid, hex] = parts;
      if (!isValidSku(kid)) {
        throw new SecretFileError(`line ${n}: kid must be 1-64 bytes of [A-Za-z0-9_.:-]`);
      }
      if (!HEX_RE.test(hex)) throw new SecretFileError(`line ${n}: secret is not valid hex`);
      const secret = Buffer.from(hex, 'hex');
      if (secret.length < MIN_SECRET_BYTES) {
        throw new SecretFileError(`line ${n}: secret must be at least 32 bytes`);
      }
      keys.push({ kid, secret });
    });
  if (keys.length === 0) throw new SecretFileError('no keys');
  return keys;
}

/**
 * Mints one admission token with the given key.
 * @param {Buffer | Uint8Array} secret
 * @param {string} kid
 * @param {string} sku
 * @param {string} user
 * @param {number | bigint} expiresAtMs Unix time in ms
 * @returns {string}
 */
export function mintAdmissionToken(secret, kid, sku, user, expiresAtMs) {
  if (!isValidSku(kid)) throw new TypeError(`invalid kid ${JSON.stringify(kid)}`);
  if (!isValidSku(sku)) throw new TypeError(`invalid sku ${JSON.stringify(sku)}`);
  if (!isValidUser(user)) throw new TypeError(`invalid user ${JSON.stringify(user)}`);
  const exp = BigInt(expiresAtMs);
  if (exp < 1n || exp > MAX_EXPIRY) {
    throw new RangeError('expiresAtMs must be 1 to 19 digits of Unix time in ms');
  }
  const payload = Buffer.from(`v1|${kid}|${sku}|${user}|${exp}`, 'utf8');
  const sig = createHmac('sha256', secret).update(payload).digest();
  return `${payload.toString('base64url')}.${sig.toString('base64url')}`;
}

/** Mints admission tokens with the first key of a secret file. */
export class AdmissionMinter {
  /**
   * @param {{ kid: string, secret: Buffer }[]} keys first signs
   * @param {{ ttlMs?: number }} [opts]
   */
  constructor(keys, opts = {}) {
    if (!Array.isArray(keys) || keys.length === 0) throw new TypeError('no keys');
    this.keys = keys;
    this.ttlMs = opts.ttlMs ?? 60000;
  }

  /** A minter over the keys of a secret file (`STOCKGATE_SECRET_FILE`, `--secret-file`). */
  static fromFile(path, opts) {
    return new AdmissionMinter(parseSecretFile(readFileSync(path, 'utf8')), opts);
  }

  /** The kid of the signing key. */
  get kid() {
    return this.keys[0].kid;
  }

  /**
   * An admission token for `user` on `sku`, valid for `ttlMs` (default the minter's) or
   * until `expiresAtMs`.
   * @param {string} sku
   * @param {string} user
   * @param {{ ttlMs?: number, expiresAtMs?: number }} [opts]
   */
  mint(sku, user, opts = {}) {
    const exp = opts.expiresAtMs ?? Date.now() + (opts.ttlMs ?? this.ttlMs);
    const { kid, secret } = this.keys[0];
    return mintAdmissionToken(secret, kid, sku, user, exp);
  }
}

// ioredis through Redis Sentinel (`new Redis({ sentinels, name })`), unmodified, against
// a stockgate group: reserves, waits for the test to kill -9 the primary (a line on
// stdin), reserves again. Each RESERVE is retried with the same request id on errors
// (connection lost, -NOREPLICAS while the new primary waits for its replica), as a
// checkout would: a retry answers REPLAY if the first send took effect.
//
// Usage: node tests/node/sentinel.js SENTINEL_PORTS(a,b,c) MASTER_NAME SECRET_FILE SKU N
// Prints `BEFORE <json>`, `READY`, then (after a line on stdin) `AFTER <json>` where
// <json> is {port, reservations: [[request_id, token, outcome], ...]}, then `RETRIES n`.
// Exits non-zero on any failure.
'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const readline = require('node:readline');
const Redis = require('ioredis');

const [ports, name, secretFile, sku, n] = process.argv.slice(2);
const [kid, hexSecret] = fs.readFileSync(secretFile, 'utf8').split(/\s+/);
const secret = Buffer.from(hexSecret, 'hex');

// PROTOCOL.md "Admission token".
function mint(user, ttlMs = 600000) {
  const payload = Buffer.from(`v1|${kid}|${sku}|${user}|${Date.now() + ttlMs}`);
  const sig = crypto.createHmac('sha256', secret).update(payload).digest();
  return `${payload.toString('base64url')}.${sig.toString('base64url')}`;
}

let retries = 0;

async function reserve(r, user, requestId) {
  const deadline = Date.now() + 30000;
  for (;;) {
    try {
      const v = await r.call('RESERVE', sku, user, mint(user), requestId);
      if (v[0] !== 'RESERVED' && v[0] !== 'REPLAY') throw new Error(`unexpected ${JSON.stringify(v)}`);
      return [requestId, v[1], v[0]];
    } catch (e) {
      if (Date.now() > deadline) throw new Error(`${requestId}: still failing after 30 s: ${e.message}`);
      retries++;
      await new Promise((ok) => setTimeout(ok, 100));
    }
  }
}

async function port(r) {
  const info = await r.info('server');
  const m = /tcp_port:(\d+)/.exec(info);
  if (!m) throw new Error('INFO server has no tcp_port');
  return Number(m[1]);
}

async function batch(r, tag) {
  const out = [];
  for (let i = 0; i < Number(n); i++) out.push(await reserve(r, `${tag}-${i}`, `${tag}-req-${i}`));
  return { port: await port(r), reservations: out };
}

async function main() {
  const r = new Redis({
    sentinels: ports.split(',').map((p) => ({ host: '127.0.0.1', port: Number(p) })),
    name,
    // Without these defaults changed, ioredis still follows the failover; they only keep
    // the test's 30 s budget meaningful (a command waits at most this long per try).
    commandTimeout: 5000,
  });
  console.log(`BEFORE ${JSON.stringify(await batch(r, 'before'))}`);
  console.log('READY');
  const rl = readline.createInterface({ input: process.stdin });
  await new Promise((ok) => rl.once('line', ok));
  rl.close();
  console.log(`AFTER ${JSON.stringify(await batch(r, 'after'))}`);
  console.log(`RETRIES ${retries}`);
  r.disconnect();
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);

// Typed results of the server's replies (docs/protocol.md sections 4 and 5). Each parser takes
// the reply as a RESP client decodes it (bulk strings as strings or Buffers, integers as
// numbers, nil as null; a map either as a flat RESP2 array or as a RESP3 Map / object) and
// throws a `ProtocolMismatch` when the shape is not the documented one.

import { StockgateError, deniedReason } from './errors.js';

/** The reply does not have the documented shape (a server of another version?). */
export class ProtocolMismatch extends StockgateError {
  constructor(message) {
    super('PROTOCOL', message);
  }
}

/** RESERVED: a new reservation; `qty` units taken. */
export class Reserved {
  constructor(token, expiresAtMs, shard) {
    this.kind = 'reserved';
    this.token = token;
    this.expiresAtMs = expiresAtMs;
    this.shard = shard;
  }
}

/** REPLAY: this (sku, user, request id) was seen before; nothing taken. */
export class Replay {
  constructor(token, expiresAtMs, shard) {
    this.kind = 'replay';
    this.token = token;
    this.expiresAtMs = expiresAtMs;
    this.shard = shard;
  }
}

/** SOLDOUT: no shard probed had the units (not remembered: a retry may succeed). */
export class SoldOut {
  constructor() {
    this.kind = 'soldout';
  }
}

/**
 * LIMIT: the per-user limit. `liveTokens` the user's reservations still RESERVED; `limit`
 * and `held` are null unless the request asked WITHLIMIT.
 */
export class Limit {
  constructor(liveTokens, limit, held) {
    this.kind = 'limit';
    this.liveTokens = liveTokens;
    this.limit = limit;
    this.held = held;
  }
}

/** `-DENIED <why>`: the admission token was refused; `reason` as INFO names it. */
export class Denied {
  constructor(reason, message) {
    this.kind = 'denied';
    this.reason = reason;
    this.message = message;
  }
}

function str(v, what) {
  if (typeof v === 'string') return v;
  if (Buffer.isBuffer(v)) return v.toString('utf8');
  throw new ProtocolMismatch(`${what}: expected a string, got ${JSON.stringify(v)}`);
}

function int(v, what) {
  if (typeof v === 'number' && Number.isInteger(v)) return v;
  if (typeof v === 'bigint') return Number(v);
  throw new ProtocolMismatch(`${what}: expected an integer, got ${JSON.stringify(v)}`);
}

function arr(v, what) {
  if (Array.isArray(v)) return v;
  throw new ProtocolMismatch(`${what}: expected an array, got ${JSON.stringify(v)}`);
}

/**
 * A RESERVE reply.
 * @returns {Reserved | Replay | SoldOut | Limit}
 */
export function parseReserve(reply) {
  const a = arr(reply, 'RESERVE');
  if (a.length === 0) throw new ProtocolMismatch('RESERVE: empty reply');
  const word = str(a[0], 'RESERVE');
  switch (word) {
    case 'RESERVED':
    case 'REPLAY': {
      if (a.length !== 4) throw new ProtocolMismatch(`RESERVE: ${word} has ${a.length} elements`);
      const Cls = word === 'RESERVED' ? Reserved : Replay;
      return new Cls(str(a[1], 'token'), int(a[2], 'expires_at_ms'), int(a[3], 'shard'));
    }
    case 'SOLDOUT':
      return new SoldOut();
    case 'LIMIT':
      // WITHLIMIT: [LIMIT, limit, held, [token...]]; else [LIMIT, token...].
      if (a.length === 4 && typeof a[1] === 'number' && Array.isArray(a[3])) {
        return new Limit(
          a[3].map((t) => str(t, 'token')),
          int(a[1], 'limit'),
          int(a[2], 'held'),
        );
      }
      return new Limit(
        a.slice(1).map((t) => str(t, 'token')),
        null,
        null,
      );
    default:
      throw new ProtocolMismatch(`RESERVE: unknown reply ${JSON.stringify(word)}`);
  }
}

/** A `-DENIED` error's text as a `Denied` result. */
export function deniedFrom(detail, message) {
  return new Denied(deniedReason(detail), message);
}

/** A RESP2 flat field list or a RESP3 map as [field, value] pairs. */
function pairs(reply, what) {
  if (reply instanceof Map) return [...reply.entries()].map(([k, v]) => [str(k, what), v]);
  if (Array.isArray(reply)) {
    if (reply.length % 2 !== 0) throw new ProtocolMismatch(`${what}: odd field list`);
    const out = [];
    for (let i = 0; i < reply.length; i += 2) out.push([str(reply[i], what), reply[i + 1]]);
    return out;
  }
  if (reply !== null && typeof reply === 'object' && !Buffer.isBuffer(reply)) {
    return Object.entries(reply);
  }
  throw new ProtocolMismatch(`${what}: expected a map, got ${JSON.stringify(reply)}`);
}

function fields(reply, what, need) {
  const m = new Map(pairs(reply, what));
  for (const f of need) {
    if (!m.has(f)) throw new ProtocolMismatch(`${what}: missing field ${f}`);
  }
  return m;
}

const RES_STATES = new Set(['RESERVED', 'COMMITTED', 'RELEASED']);

/**
 * A RESERVATION reply: a `Reservation`, or null (unknown, or purged by retention).
 */
export function parseReservation(reply) {
  if (reply === null || reply === undefined) return null;
  const m = fields(reply, 'RESERVATION', [
    'token',
    'sku',
    'user',
    'request_id',
    'qty',
    'shard',
    'state',
    'expires_at_ms',
    'created_at_ms',
  ]);
  const state = str(m.get('state'), 'state');
  if (!RES_STATES.has(state)) throw new ProtocolMismatch(`RESERVATION: unknown state ${state}`);
  return {
    state,
    token: str(m.get('token'), 'token'),
    sku: str(m.get('sku'), 'sku'),
    user: str(m.get('user'), 'user'),
    requestId: str(m.get('request_id'), 'request_id'),
    qty: int(m.get('qty'), 'qty'),
    shard: int(m.get('shard'), 'shard'),
    expiresAtMs: int(m.get('expires_at_ms'), 'expires_at_ms'),
    createdAtMs: int(m.get('created_at_ms'), 'created_at_ms'),
  };
}

const SALE_STATES = new Set(['OPEN', 'PAUSED', 'FENCED', 'MOVING']);

/** A SALE.INFO reply. */
export function parseSaleInfo(reply) {
  const m = fields(reply, 'SALE.INFO', [
    'total',
    'available',
    'reserved',
    'committed',
    'shards',
    'ttl_ms',
    'limit',
    'state',
    'key_fingerprint',
    'shard_available',
  ]);
  const state = str(m.get('state'), 'state');
  if (!SALE_STATES.has(state)) throw new ProtocolMismatch(`SALE.INFO: unknown state ${state}`);
  return {
    state,
    total: int(m.get('total'), 'total'),
    available: int(m.get('available'), 'available'),
    reserved: int(m.get('reserved'), 'reserved'),
    committed: int(m.get('committed'), 'committed'),
    shards: int(m.get('shards'), 'shards'),
    ttlMs: int(m.get('ttl_ms'), 'ttl_ms'),
    limit: int(m.get('limit'), 'limit'),
    keyFingerprint: str(m.get('key_fingerprint'), 'key_fingerprint'),
    shardAvailable: arr(m.get('shard_available'), 'shard_available').map((v) => int(v, 'shard')),
  };
}

/** A COMMIT reply: `:1` committed by this call, `:0` already committed. */
export function parseCommit(reply) {
  const n = int(reply, 'COMMIT');
  if (n === 1) return 'committed';
  if (n === 0) return 'already_committed';
  throw new ProtocolMismatch(`COMMIT: unexpected ${n}`);
}

/** A RELEASE reply: true if this call returned the units to stock. */
export function parseRelease(reply) {
  const n = int(reply, 'RELEASE');
  if (n === 1) return true;
  if (n === 0) return false;
  throw new ProtocolMismatch(`RELEASE: unexpected ${n}`);
}

/** An integer reply (STOCK, EXTEND). */
export function parseInteger(reply, what) {
  return int(reply, what);
}

// --- The waiting room (docs/protocol.md section 4a) -------------------------------------

/** A ROOM.JOIN reply `[ticket, position, eta_ms]`: `{ ticket, position, etaMs }`. */
export function parseRoomJoin(reply) {
  const a = arr(reply, 'ROOM.JOIN');
  if (a.length !== 3) throw new ProtocolMismatch(`ROOM.JOIN: ${a.length} elements`);
  return {
    ticket: str(a[0], 'ticket'),
    position: int(a[1], 'position'),
    etaMs: int(a[2], 'eta_ms'),
  };
}

/** A ROOM.LEAVE reply: true if this call gave the place up, false if the user held none. */
export function parseRoomLeave(reply) {
  const n = int(reply, 'ROOM.LEAVE');
  if (n === 1) return true;
  if (n === 0) return false;
  throw new ProtocolMismatch(`ROOM.LEAVE: unexpected ${n}`);
}

/** ROOM.STATUS words without values, and their `kind`. */
const ROOM_WORDS_ALONE = {
  RESERVED: 'reserved',
  SOLDOUT: 'soldout',
  EXPIRED: 'expired',
  LEFT: 'left',
};

/**
 * A ROOM.STATUS reply, discriminated on `kind`: `waiting` (`position`, `etaMs`),
 * `admitted` (`admission`, the token for RESERVE, and `untilMs`), `before_open`
 * (`opensAtMs`), `reserved`, `soldout`, `expired`, `left`.
 */
export function parseRoomStatus(reply) {
  const a = arr(reply, 'ROOM.STATUS');
  if (a.length === 0) throw new ProtocolMismatch('ROOM.STATUS: empty reply');
  const word = str(a[0], 'ROOM.STATUS');
  const n = a.length;
  if (word === 'WAITING' && n === 3) {
    return { kind: 'waiting', position: int(a[1], 'position'), etaMs: int(a[2], 'eta_ms') };
  }
  if (word === 'ADMITTED' && n === 3) {
    return { kind: 'admitted', admission: str(a[1], 'admission'), untilMs: int(a[2], 'until_ms') };
  }
  if (word === 'BEFORE-OPEN' && n === 2) {
    return { kind: 'before_open', opensAtMs: int(a[1], 'opens_at_ms') };
  }
  if (Object.hasOwn(ROOM_WORDS_ALONE, word) && n === 1) return { kind: ROOM_WORDS_ALONE[word] };
  throw new ProtocolMismatch(`ROOM.STATUS: unexpected reply ${JSON.stringify(word)} with ${n} elements`);
}

function flag(v, what) {
  const n = int(v, what);
  if (n !== 0 && n !== 1) throw new ProtocolMismatch(`${what}: expected 0 or 1, got ${n}`);
  return n === 1;
}

/** A ROOM.INFO reply: the room's settings and counts. */
export function parseRoomInfo(reply) {
  const m = fields(reply, 'ROOM.INFO', [
    'opens_at_ms',
    'rate',
    'overadmit_permille',
    'admit_ttl_ms',
    'window_ms',
    'max_waiting',
    'waiting',
    'admitted',
    'open',
    'sold_out',
  ]);
  return {
    opensAtMs: int(m.get('opens_at_ms'), 'opens_at_ms'),
    rate: int(m.get('rate'), 'rate'),
    overadmitPermille: int(m.get('overadmit_permille'), 'overadmit_permille'),
    admitTtlMs: int(m.get('admit_ttl_ms'), 'admit_ttl_ms'),
    windowMs: int(m.get('window_ms'), 'window_ms'),
    maxWaiting: int(m.get('max_waiting'), 'max_waiting'),
    waiting: int(m.get('waiting'), 'waiting'),
    admitted: int(m.get('admitted'), 'admitted'),
    open: flag(m.get('open'), 'open'),
    soldOut: flag(m.get('sold_out'), 'sold_out'),
  };
}

// --- Live counts over RESP (docs/protocol.md section 4a, "Live counts over RESP") ------

function jsonInt(o, name, what) {
  const v = o[name];
  if (typeof v !== 'number' || !Number.isInteger(v)) {
    throw new ProtocolMismatch(`${what}: ${name} is not an integer: ${JSON.stringify(v)}`);
  }
  return v;
}

function jsonStr(o, name, what) {
  const v = o[name];
  if (typeof v !== 'string') throw new ProtocolMismatch(`${what}: ${name} is not a string: ${JSON.stringify(v)}`);
  return v;
}

function isObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** A buyer channel's status words without values, and their `kind`. */
const PLACE_WORDS_ALONE = { ...ROOM_WORDS_ALONE, GONE: 'gone' };

/**
 * A buyer channel's `"you"`, discriminated on `kind` as `parseRoomStatus`'s: `waiting`
 * (`position`, `etaMs`), `admitted` (`untilMs`; no token: `status` gives it),
 * `before_open` (`opensAtMs`), `reserved`, `soldout`, `expired`, `left`, `gone`.
 */
export function parsePlace(v) {
  const what = 'live place';
  if (!isObject(v)) throw new ProtocolMismatch(`${what}: expected an object, got ${JSON.stringify(v)}`);
  const word = jsonStr(v, 'status', what);
  if (word === 'WAITING') {
    return { kind: 'waiting', position: jsonInt(v, 'position', what), etaMs: jsonInt(v, 'eta_ms', what) };
  }
  if (word === 'ADMITTED') return { kind: 'admitted', untilMs: jsonInt(v, 'until_ms', what) };
  if (word === 'BEFORE-OPEN') return { kind: 'before_open', opensAtMs: jsonInt(v, 'opens_at_ms', what) };
  if (Object.hasOwn(PLACE_WORDS_ALONE, word)) return { kind: PLACE_WORDS_ALONE[word] };
  throw new ProtocolMismatch(`${what}: unknown status ${JSON.stringify(word)}`);
}

/**
 * One live channel message (`sale:<sku>:live` or `place:<ticket>`; the JSON as a string or
 * Buffer): `{ sku, available, held, sold, waiting, admitted, room, state }`, plus `you` on
 * a buyer's channel.
 */
export function parseLive(payload) {
  const what = 'live counts';
  let o;
  try {
    o = JSON.parse(str(payload, what));
  } catch (e) {
    if (e instanceof ProtocolMismatch) throw e;
    throw new ProtocolMismatch(`${what}: not JSON: ${JSON.stringify(String(payload))}`);
  }
  if (!isObject(o)) throw new ProtocolMismatch(`${what}: expected an object, got ${JSON.stringify(o)}`);
  if (typeof o.room !== 'boolean') throw new ProtocolMismatch(`${what}: room is not a boolean: ${JSON.stringify(o.room)}`);
  const counts = {
    sku: jsonStr(o, 'sku', what),
    available: jsonInt(o, 'available', what),
    held: jsonInt(o, 'held', what),
    sold: jsonInt(o, 'sold', what),
    waiting: jsonInt(o, 'waiting', what),
    admitted: jsonInt(o, 'admitted', what),
    room: o.room,
    state: jsonStr(o, 'state', what),
  };
  if (o.you !== undefined) counts.you = parsePlace(o.you);
  return counts;
}

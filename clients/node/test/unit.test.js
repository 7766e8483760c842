// Parsing of every reply shape, the error classes per code, and admission-token minting,
// without a server (server.test.js has the real server accept what is minted here).

import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { describe, it } from 'node:test';

import {
  Stockgate,
  AdmissionDenied,
  BadTicket,
  NoRoom,
  NotQueued,
  QueueFull,
  SoldOutError,
  TooManyJoins,
  parseRoomInfo,
  parseRoomJoin,
  parseRoomLeave,
  parseRoomStatus,
  AdmissionMinter,
  Ask,
  BusyGroup,
  ClusterDown,
  CrossSlot,
  Moved,
  TryAgain,
  CommandError,
  Denied,
  ExecAbort,
  Exists,
  Expired,
  Fenced,
  LedgerError,
  LedgerInvalidArgument,
  Limit,
  Loading,
  NoAuth,
  NoGoodSlave,
  NoGroup,
  NoPerm,
  NoProto,
  NoQuorum,
  NoReplicas,
  NoReservation,
  NoSale,
  OrderConflict,
  OrderNotFound,
  OrderRefused,
  Paused,
  ProtocolMismatch,
  ReadOnly,
  Released,
  Replay,
  Reserved,
  SecretFileError,
  SoldOut,
  StockgateError,
  WrongPass,
  deniedReason,
  errorFromReply,
  ledgerErrorFrom,
  mintAdmissionToken,
  parseCommit,
  parseRelease,
  parseReservation,
  parseReserve,
  parseSaleInfo,
  parseSecretFile,
} from '../src/index.js';

const TOKEN = '{FLASH}k5v3nq2hx7cfwa4ptgzr6mdj3e';

describe('RESERVE replies', () => {
  it('RESERVED and REPLAY carry token, expiry and shard', () => {
    const r = parseReserve(['RESERVED', TOKEN, 1767225630000, 3]);
    assert.ok(r instanceof Reserved);
    assert.deepEqual({ ...r }, { kind: 'reserved', token: TOKEN, expiresAtMs: 1767225630000, shard: 3 });
    const p = parseReserve([Buffer.from('REPLAY'), Buffer.from(TOKEN), 1767225630000, 3]);
    assert.ok(p instanceof Replay);
    assert.equal(p.kind, 'replay');
    assert.equal(p.token, TOKEN);
  });

  it('SOLDOUT', () => {
    const r = parseReserve(['SOLDOUT']);
    assert.ok(r instanceof SoldOut);
    assert.equal(r.kind, 'soldout');
  });

  it('LIMIT, with and without WITHLIMIT', () => {
    const plain = parseReserve(['LIMIT', TOKEN]);
    assert.ok(plain instanceof Limit);
    assert.deepEqual({ ...plain }, { kind: 'limit', liveTokens: [TOKEN], limit: null, held: null });
    assert.deepEqual(parseReserve(['LIMIT']).liveTokens, []);
    const w = parseReserve(['LIMIT', 2, 2, [TOKEN]]);
    assert.deepEqual({ ...w }, { kind: 'limit', liveTokens: [TOKEN], limit: 2, held: 2 });
    const none = parseReserve(['LIMIT', 1, 1, []]);
    assert.deepEqual(none.liveTokens, []);
    assert.equal(none.held, 1);
  });

  it('refuses shapes the protocol does not have', () => {
    for (const bad of [[], ['RESERVED', TOKEN, 1], ['MAYBE'], 'RESERVED', ['RESERVED', TOKEN, '1', 3]]) {
      assert.throws(() => parseReserve(bad), ProtocolMismatch, JSON.stringify(bad));
    }
  });
});

describe('RESERVATION and SALE.INFO replies', () => {
  const flat = [
    'token', TOKEN, 'sku', 'FLASH', 'user', 'alice', 'request_id', 'order-17',
    'qty', 2, 'shard', 3, 'state', 'RESERVED', 'expires_at_ms', 1767225630000,
    'created_at_ms', 1767225000000,
  ];
  const expected = {
    state: 'RESERVED', token: TOKEN, sku: 'FLASH', user: 'alice', requestId: 'order-17',
    qty: 2, shard: 3, expiresAtMs: 1767225630000, createdAtMs: 1767225000000,
  };

  it('RESP2 field list and RESP3 map give the same reservation', () => {
    assert.deepEqual(parseReservation(flat), expected);
    const map = new Map();
    for (let i = 0; i < flat.length; i += 2) map.set(flat[i], flat[i + 1]);
    assert.deepEqual(parseReservation(map), expected);
  });

  it('nil is null; a missing field or unknown state is a mismatch', () => {
    assert.equal(parseReservation(null), null);
    assert.throws(() => parseReservation(flat.slice(0, 16)), ProtocolMismatch);
    const bad = [...flat];
    bad[13] = 'EXPIRED';
    assert.throws(() => parseReservation(bad), ProtocolMismatch);
  });

  it('SALE.INFO', () => {
    const info = parseSaleInfo([
      'total', 1000, 'available', 990, 'reserved', 8, 'committed', 2, 'shards', 2,
      'ttl_ms', 1500, 'limit', 0, 'state', 'OPEN', 'key_fingerprint', '49dc46fa360f69d0',
      'shard_available', [495, 495],
    ]);
    assert.deepEqual(info, {
      state: 'OPEN', total: 1000, available: 990, reserved: 8, committed: 2, shards: 2,
      ttlMs: 1500, limit: 0, keyFingerprint: '49dc46fa360f69d0', shardAvailable: [495, 495],
    });
    assert.throws(() => parseSaleInfo(['total', 1]), ProtocolMismatch);
    for (const state of ['PAUSED', 'FENCED', 'MOVING']) {
      const moving = parseSaleInfo([
        'total', 1, 'available', 1, 'reserved', 0, 'committed', 0, 'shards', 1,
        'ttl_ms', 1500, 'limit', 0, 'state', state, 'key_fingerprint', '49dc46fa360f69d0',
        'shard_available', [1],
      ]);
      assert.equal(moving.state, state);
    }
  });

  it('COMMIT and RELEASE integers', () => {
    assert.equal(parseCommit(1), 'committed');
    assert.equal(parseCommit(0), 'already_committed');
    assert.throws(() => parseCommit(2), ProtocolMismatch);
    assert.equal(parseRelease(1), true);
    assert.equal(parseRelease(0), false);
    assert.throws(() => parseRelease('1'), ProtocolMismatch);
  });
});

describe('waiting room replies', () => {
  it('ROOM.JOIN: ticket, position, ETA', () => {
    assert.deepEqual(parseRoomJoin(['t1|k|S|u|1|sig', 3, 1500]), { ticket: 't1|k|S|u|1|sig', position: 3, etaMs: 1500 });
    assert.deepEqual(parseRoomJoin([Buffer.from('t'), 0, 0]), { ticket: 't', position: 0, etaMs: 0 });
    for (const bad of [['t', 1], 't', null, ['t', 'x', 1]]) {
      assert.throws(() => parseRoomJoin(bad), ProtocolMismatch);
    }
  });

  it('ROOM.STATUS: every word, discriminated on kind', () => {
    const cases = [
      [['WAITING', 4, 2000], { kind: 'waiting', position: 4, etaMs: 2000 }],
      [[Buffer.from('ADMITTED'), Buffer.from('tok.sig'), 17], { kind: 'admitted', admission: 'tok.sig', untilMs: 17 }],
      [['BEFORE-OPEN', 1767225630000], { kind: 'before_open', opensAtMs: 1767225630000 }],
      [['RESERVED'], { kind: 'reserved' }],
      [['SOLDOUT'], { kind: 'soldout' }],
      [['EXPIRED'], { kind: 'expired' }],
      [[Buffer.from('LEFT')], { kind: 'left' }],
    ];
    for (const [reply, want] of cases) assert.deepEqual(parseRoomStatus(reply), want);
    for (const bad of [[], ['WAITING', 1], ['ADMITTED', 't'], ['LEFT', 1], ['GONE'], ['toString'], 'WAITING', null]) {
      assert.throws(() => parseRoomStatus(bad), ProtocolMismatch, JSON.stringify(bad));
    }
  });

  it('ROOM.LEAVE and ROOM.INFO (RESP2 list, RESP3 map)', () => {
    assert.equal(parseRoomLeave(1), true);
    assert.equal(parseRoomLeave(0), false);
    assert.throws(() => parseRoomLeave(2), ProtocolMismatch);
    const fields = {
      opens_at_ms: 0, rate: 100, overadmit_permille: 1000, admit_ttl_ms: 120000, window_ms: 10000,
      max_waiting: 1000000, waiting: 7, admitted: 2, open: 1, sold_out: 0,
    };
    const want = {
      opensAtMs: 0, rate: 100, overadmitPermille: 1000, admitTtlMs: 120000, windowMs: 10000,
      maxWaiting: 1000000, waiting: 7, admitted: 2, open: true, soldOut: false,
    };
    assert.deepEqual(parseRoomInfo(Object.entries(fields).flat()), want);
    assert.deepEqual(parseRoomInfo(new Map(Object.entries(fields))), want);
    assert.throws(() => parseRoomInfo(Object.entries(fields).flat().slice(0, -2)), ProtocolMismatch);
    assert.throws(() => parseRoomInfo({ ...fields, open: 2 }), ProtocolMismatch);
  });
});

describe('errors', () => {
  const cases = [
    ['ERR syntax error', CommandError, 'ERR'],
    ['NOSALE no such sale', NoSale, 'NOSALE'],
    ['FENCED state unproven; rebuild the sale from the ledger first', Fenced, 'FENCED'],
    ['PAUSED sale is paused', Paused, 'PAUSED'],
    ['DENIED bad signature', AdmissionDenied, 'DENIED'],
    ['EXISTS sale exists with different parameters', Exists, 'EXISTS'],
    ['NORES no such reservation in state RESERVED', NoReservation, 'NORES'],
    ['EXPIRED reservation expired', Expired, 'EXPIRED'],
    ['RELEASED units already went back to stock', Released, 'RELEASED'],
    ['NOAUTH Authentication required.', NoAuth, 'NOAUTH'],
    ['WRONGPASS invalid username-password pair or user is disabled.', WrongPass, 'WRONGPASS'],
    ["NOPERM User shop has no permissions to run the 'commit|verified' command", NoPerm, 'NOPERM'],
    ['NOPROTO unsupported protocol version', NoProto, 'NOPROTO'],
    ['EXECABORT Transaction discarded because of previous errors.', ExecAbort, 'EXECABORT'],
    ["READONLY You can't write against a read only replica.", ReadOnly, 'READONLY'],
    ['LOADING this stockgate node is catching up with its group', Loading, 'LOADING'],
    ['NOREPLICAS Not enough good replicas to write.', NoReplicas, 'NOREPLICAS'],
    ['NOQUORUM no Raft leader is known to this node', NoQuorum, 'NOQUORUM'],
    ['NOGOODSLAVE No suitable replica to promote', NoGoodSlave, 'NOGOODSLAVE'],
    ["NOGROUP No such key 'k' or consumer group 'g'", NoGroup, 'NOGROUP'],
    ['BUSYGROUP Consumer Group name already exists', BusyGroup, 'BUSYGROUP'],
    ['MOVED 866 127.0.0.1:7001', Moved, 'MOVED'],
    ['ASK 866 127.0.0.1:7001', Ask, 'ASK'],
    ['TRYAGAIN sale SKU is moving to another group', TryAgain, 'TRYAGAIN'],
    ["CROSSSLOT Keys in request don't hash to the same slot", CrossSlot, 'CROSSSLOT'],
    ['CLUSTERDOWN Hash slot not served', ClusterDown, 'CLUSTERDOWN'],
    ['QUEUEFULL queue full: 45 buyers are already waiting for this sale', QueueFull, 'QUEUEFULL'],
    ['SOLDOUT sold out', SoldOutError, 'SOLDOUT'],
    ['TOOMANYJOINS too many joins: at most 4 places per user per sale', TooManyJoins, 'TOOMANYJOINS'],
    ['NOROOM no waiting room for this sale', NoRoom, 'NOROOM'],
    ['BADTICKET ticket refused: bad signature', BadTicket, 'BADTICKET'],
    ['NOTQUEUED not in the queue', NotQueued, 'NOTQUEUED'],
  ];

  for (const [text, Cls, code] of cases) {
    it(`${code} is ${Cls.name}`, () => {
      const e = errorFromReply(text);
      assert.ok(e instanceof Cls);
      assert.ok(e instanceof StockgateError);
      assert.ok(e instanceof Error);
      assert.equal(e.code, code);
      assert.equal(e.name, Cls.name);
      assert.equal(e.message, text);
      assert.equal(e.detail, text.slice(code.length + 1));
    });
  }

  it('QUEUEFULL names the limit; BADTICKET says whether the ticket is stale', () => {
    assert.equal(errorFromReply('QUEUEFULL queue full: 45 buyers are already waiting for this sale').maxWaiting, 45);
    assert.equal(errorFromReply('QUEUEFULL full').maxWaiting, null);
    assert.equal(errorFromReply('BADTICKET stale ticket: replaced by a later join').stale, true);
    assert.equal(errorFromReply('BADTICKET ticket refused: ticket of another user').stale, false);
  });

  it('an unknown code is the base class with that code', () => {
    const e = errorFromReply('WEIRD something new');
    assert.equal(e.constructor, StockgateError);
    assert.equal(e.code, 'WEIRD');
    assert.equal(errorFromReply('BARE').code, 'BARE');
  });

  it("EXPIRED names the hold's deadline when the server gives it", () => {
    const e = errorFromReply(
      'EXPIRED reservation expired at 1767225630000 ms; if the ledger accepted the payment before then, send COMMIT token VERIFIED',
    );
    assert.equal(e.expiresAtMs, 1767225630000);
    assert.equal(errorFromReply('EXPIRED reservation expired').expiresAtMs, null);
  });

  it('DENIED reasons as INFO names them', () => {
    const texts = {
      'malformed admission token': 'malformed',
      'unknown key id': 'unknown_key',
      'bad signature': 'bad_signature',
      'token bound to another sku': 'wrong_sku',
      'token bound to another user': 'wrong_user',
      expired: 'expired',
      'something else': 'unknown',
    };
    for (const [text, reason] of Object.entries(texts)) {
      assert.equal(deniedReason(text), reason);
      assert.equal(errorFromReply(`DENIED ${text}`).reason, reason);
    }
    const d = new Denied('expired', 'DENIED expired');
    assert.equal(d.kind, 'denied');
  });

  it('ledger SQLSTATEs', () => {
    const refused = ledgerErrorFrom({
      code: 'SG001',
      message: 'order {FLASH}k5v3nq2hx7cfwa4ptgzr6mdj3e is COMMITTED: cancel refused',
    });
    assert.ok(refused instanceof OrderRefused);
    assert.ok(refused instanceof LedgerError);
    assert.ok(refused instanceof StockgateError);
    assert.equal(refused.code, 'SG001');
    assert.equal(refused.status, 'COMMITTED');
    assert.equal(refused.token, TOKEN);
    assert.ok(ledgerErrorFrom({ code: 'SG002', message: 'x' }) instanceof OrderConflict);
    assert.ok(ledgerErrorFrom({ code: 'SG003', message: 'x' }) instanceof OrderNotFound);
    assert.ok(ledgerErrorFrom({ code: 'SG004', message: 'x' }) instanceof LedgerInvalidArgument);
    assert.equal(ledgerErrorFrom({ code: '23505', message: 'unique violation' }), null);
    assert.equal(ledgerErrorFrom(new Error('plain')), null);
  });
});

describe('admission tokens', () => {
  it('known answers (HMAC-SHA256, unpadded base64url)', () => {
    // Computed independently (Python's hmac and base64) from docs/protocol.md section 3.
    assert.equal(
      mintAdmissionToken(Buffer.alloc(32, 7), 'k1', 'SKU', 'u1', 123),
      'djF8azF8U0tVfHUxfDEyMw.RY13MbgPbMW-anaaZy4MouzdJtqVMql8rHFyfzwac3E',
    );
    const secret = Buffer.from(Array.from({ length: 64 }, (_, i) => i + 32));
    assert.equal(
      mintAdmissionToken(secret, 'kid.2:x', 'FLASH-1', 'user@example.com', 1796000000000n),
      'djF8a2lkLjI6eHxGTEFTSC0xfHVzZXJAZXhhbXBsZS5jb218MTc5NjAwMDAwMDAwMA.6K0VngiX-E4LY6K1DPOo8-cmKL_JekrW8n16jnBOuHE',
    );
  });

  it('payload and signature', () => {
    const secret = Buffer.alloc(32, 9);
    const t = mintAdmissionToken(secret, 'k1', 'FLASH', 'alice', 1767225630000);
    const [p, s] = t.split('.');
    assert.match(p, /^[A-Za-z0-9_-]+$/);
    assert.equal(Buffer.from(p, 'base64url').toString(), 'v1|k1|FLASH|alice|1767225630000');
    const want = createHmac('sha256', secret).update('v1|k1|FLASH|alice|1767225630000').digest();
    assert.deepEqual(Buffer.from(s, 'base64url'), want);
    assert.equal(s.length, 43);
  });

  it('refuses what the server would call malformed', () => {
    const k = Buffer.alloc(32, 1);
    assert.throws(() => mintAdmissionToken(k, 'k1', 'BAD SKU', 'u', 1), TypeError);
    assert.throws(() => mintAdmissionToken(k, 'k1', 'S', 'a|b', 1), TypeError);
    assert.throws(() => mintAdmissionToken(k, 'k1', 'S', 'a{b', 1), TypeError);
    assert.throws(() => mintAdmissionToken(k, 'k|1', 'S', 'u', 1), TypeError);
    assert.throws(() => mintAdmissionToken(k, 'k1', 'S', 'u', 0), RangeError);
    assert.throws(() => mintAdmissionToken(k, 'k1', 'S', 'u', 10n ** 19n), RangeError);
  });

  it('secret files: the first key signs; comments, blank lines, CRLF', () => {
    const a = 'ab'.repeat(32);
    const b = 'CD'.repeat(40);
    const keys = parseSecretFile(`# keys\n\nk2 ${a}\r\n  old.1   ${b}  \n`);
    assert.deepEqual(
      keys.map((k) => [k.kid, k.secret.toString('hex')]),
      [['k2', a], ['old.1', b.toLowerCase()]],
    );
    const m = new AdmissionMinter(keys);
    assert.equal(m.kid, 'k2');
    const t = m.mint('FLASH', 'bob', { expiresAtMs: 42 });
    assert.equal(t, mintAdmissionToken(Buffer.from(a, 'hex'), 'k2', 'FLASH', 'bob', 42));
    const before = Date.now();
    const exp = Number(Buffer.from(m.mint('FLASH', 'bob', { ttlMs: 5000 }).split('.')[0], 'base64url').toString().split('|')[4]);
    assert.ok(exp >= before + 5000 && exp <= Date.now() + 5000);
  });

  it('secret files the server refuses are refused', () => {
    const ok = 'ab'.repeat(32);
    for (const bad of ['', '# only a comment\n', `k1\n`, `k1 ${ok} extra\n`, `k1 ${'ab'.repeat(31)}\n`,
      `k1 ${ok.slice(1)}\n`, `k1 zz${ok.slice(2)}\n`, `bad/kid ${ok}\n`]) {
      assert.throws(() => parseSecretFile(bad), SecretFileError, JSON.stringify(bad));
    }
  });
});

describe('addresses', () => {
  it('a redis:// URL gives its credentials, percent-decoded', async () => {
    const sg = new Stockgate({ addr: 'redis://shop:s3%40cret@127.0.0.1:1', redisOptions: { lazyConnect: true } });
    assert.equal(sg.conns[0].options.username, 'shop');
    assert.equal(sg.conns[0].options.password, 's3@cret');
    await sg.close();
    assert.throws(
      () => new Stockgate({ addr: 'redis://shop:pw@127.0.0.1:1', username: 'other', redisOptions: { lazyConnect: true } }),
      TypeError,
    );
  });

  it('exactly one of addr, sentinels and cluster', () => {
    assert.throws(() => new Stockgate({}), TypeError);
    assert.throws(() => new Stockgate({ addr: '127.0.0.1:1', cluster: '127.0.0.1:2' }), TypeError);
  });
});

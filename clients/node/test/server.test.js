// Against the real server (STOCKGATE_ADDR, STOCKGATE_SECRET_FILE): the tokens minted here
// are accepted, every typed result and error comes back as the server answers it, and calls
// whose connections are killed under them are retried with the same request id.

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { Redis } from 'ioredis';

import {
  AdmissionMinter,
  BadTicket,
  CommandError,
  Denied,
  Exists,
  Expired,
  Fenced,
  Limit,
  NoReservation,
  NoRoom,
  NoSale,
  Paused,
  QueueFull,
  Released,
  Replay,
  Reserved,
  SoldOut,
  SoldOutError,
  Stockgate,
  TooManyJoins,
  Unavailable,
  mintAdmissionToken,
} from '../src/index.js';
import { env, needs, runId, sleep, until } from './env.js';

const skip = needs('STOCKGATE_ADDR', 'STOCKGATE_SECRET_FILE');

describe('against the server', { skip }, () => {
  /** @type {Stockgate} */
  let sg;
  /** @type {AdmissionMinter} */
  let minter;
  let n = 0;
  const sale = async (opts = {}) => {
    const sku = `NODE-${runId}-${++n}`;
    await sg.createSale(sku, opts.total ?? 10, { shards: 1, ttlMs: 60000, ...opts.create });
    return sku;
  };

  before(async () => {
    sg = new Stockgate({ addr: env.addr, connections: 4 });
    minter = AdmissionMinter.fromFile(env.secretFile);
    await sg.ready();
  });
  after(() => sg.close());

  it('a minted token is accepted: RESERVED, then REPLAY, then the reservation', async () => {
    const sku = await sale();
    const adm = minter.mint(sku, 'alice');
    const r = await sg.reserve(sku, 'alice', adm, 'order-1', { qty: 2 });
    assert.ok(r instanceof Reserved, JSON.stringify(r));
    assert.ok(r.token.startsWith(`{${sku}}`));
    assert.ok(r.expiresAtMs > Date.now() + 50000);
    const again = await sg.reserve(sku, 'alice', adm, 'order-1', { qty: 2 });
    assert.ok(again instanceof Replay);
    assert.equal(again.token, r.token);
    assert.equal(again.expiresAtMs, r.expiresAtMs);
    const res = await sg.reservation(r.token);
    assert.equal(res.state, 'RESERVED');
    assert.equal(res.qty, 2);
    assert.equal(res.user, 'alice');
    assert.equal(res.requestId, 'order-1');
    assert.equal(res.expiresAtMs, r.expiresAtMs);
    assert.ok(res.createdAtMs <= Date.now());
    assert.equal(await sg.stock(sku), 8);
    const info = await sg.saleInfo(sku);
    assert.equal(info.state, 'OPEN');
    assert.deepEqual([info.total, info.available, info.reserved, info.committed], [10, 8, 2, 0]);
    assert.equal(await sg.commit(r.token), 'committed');
    assert.equal(await sg.commit(r.token), 'already_committed');
    assert.equal((await sg.reservation(r.token)).state, 'COMMITTED');
    assert.equal(await sg.release(r.token), false);
    assert.equal((await sg.saleInfo(sku)).committed, 2);
  });

  it('each admission refusal is a Denied result with its reason', async () => {
    const sku = await sale();
    const other = await sale();
    const [{ kid }] = minter.keys;
    const exp = Date.now() + 60000;
    const cases = [
      ['malformed', 'not-a-token'],
      ['unknown_key', mintAdmissionToken(Buffer.alloc(32, 1), 'nokey', sku, 'bob', exp)],
      ['bad_signature', mintAdmissionToken(Buffer.alloc(32, 1), kid, sku, 'bob', exp)],
      ['wrong_sku', minter.mint(other, 'bob')],
      ['wrong_user', minter.mint(sku, 'carol')],
      ['expired', minter.mint(sku, 'bob', { expiresAtMs: Date.now() - 1000 })],
    ];
    for (const [reason, adm] of cases) {
      const r = await sg.reserve(sku, 'bob', adm, `r-${reason}`);
      assert.ok(r instanceof Denied, `${reason}: ${JSON.stringify(r)}`);
      assert.equal(r.kind, 'denied');
      assert.equal(r.reason, reason);
      assert.match(r.message, /^DENIED /);
    }
    assert.equal(await sg.stock(sku), 10);
  });

  it('SOLDOUT and LIMIT (with WITHLIMIT)', async () => {
    const sku = await sale({ total: 3, create: { limit: 1 } });
    const a = await sg.reserve(sku, 'u1', minter.mint(sku, 'u1'), 'a');
    assert.ok(a instanceof Reserved);
    const l = await sg.reserve(sku, 'u1', minter.mint(sku, 'u1'), 'b');
    assert.ok(l instanceof Limit);
    assert.deepEqual(l.liveTokens, [a.token]);
    assert.equal(l.limit, null);
    const w = await sg.reserve(sku, 'u1', minter.mint(sku, 'u1'), 'c', { withLimit: true });
    assert.deepEqual({ ...w }, { kind: 'limit', liveTokens: [a.token], limit: 1, held: 1 });
    await sg.reserve(sku, 'u2', minter.mint(sku, 'u2'), 'a');
    await sg.reserve(sku, 'u3', minter.mint(sku, 'u3'), 'a');
    const s = await sg.reserve(sku, 'u4', minter.mint(sku, 'u4'), 'a');
    assert.ok(s instanceof SoldOut);
  });

  it('typed errors: NoReservation, Released, NoSale, Exists, CommandError', async () => {
    const sku = await sale();
    const unknown = `{${sku}}${'a'.repeat(26)}`;
    await assert.rejects(sg.commit(unknown), NoReservation);
    await assert.rejects(sg.extend(unknown, 1000), NoReservation);
    assert.equal(await sg.reservation(unknown), null);
    assert.equal(await sg.release(unknown), false);
    const r = await sg.reserve(sku, 'dan', minter.mint(sku, 'dan'), 'x');
    assert.equal(await sg.release(r.token, { reason: 'cancel' }), true);
    assert.equal(await sg.release(r.token, { reason: 'cancel' }), false);
    await assert.rejects(sg.commit(r.token), (e) => e instanceof Released && e.code === 'RELEASED');
    await assert.rejects(sg.stock(`NOPE-${runId}`), (e) => e instanceof NoSale && e.code === 'NOSALE');
    await assert.rejects(sg.saleInfo(`NOPE-${runId}`), NoSale);
    await assert.rejects(sg.createSale(sku, 11, { shards: 1, ttlMs: 60000 }), Exists);
    await sg.createSale(sku, 10, { shards: 1, ttlMs: 60000 });
    await assert.rejects(
      sg.commit('not-a-token'),
      (e) => e instanceof CommandError && e.code === 'ERR' && /^invalid token/.test(e.detail),
    );
    await assert.rejects(sg.release(r.token, { reason: 'bored' }), TypeError);
  });

  it('Expired past the deadline; COMMIT VERIFIED still commits; EXTEND moves it', async () => {
    const sku = await sale({ create: { ttlMs: 300 } });
    const a = await sg.reserve(sku, 'eve', minter.mint(sku, 'eve'), 'a');
    const b = await sg.reserve(sku, 'eve', minter.mint(sku, 'eve'), 'b');
    const at = await sg.extend(b.token, 60000);
    assert.ok(at > Date.now() + 50000);
    await sleep(500);
    await assert.rejects(
      sg.commit(a.token),
      (e) => e instanceof Expired && e.code === 'EXPIRED' && e.expiresAtMs === a.expiresAtMs,
    );
    await assert.rejects(sg.extend(a.token, 1000), Expired);
    // Open mode: every connection is admin, which may state the ledger verified a payment.
    assert.equal(await sg.commit(a.token, { verified: true }), 'committed');
    assert.equal(await sg.commit(b.token), 'committed');
  });

  it('Fenced and Paused', async () => {
    const sku = await sale();
    await sg.call(['SALE.PAUSE', sku]);
    assert.equal((await sg.saleInfo(sku)).state, 'PAUSED');
    await assert.rejects(sg.reserve(sku, 'fay', minter.mint(sku, 'fay'), 'a'), Paused);
    await sg.call(['SALE.RESUME', sku]);
    const r = await sg.reserve(sku, 'fay', minter.mint(sku, 'fay'), 'a');
    assert.ok(r instanceof Reserved);
    await sg.call(['SALE.FENCE', sku]);
    assert.equal((await sg.saleInfo(sku)).state, 'FENCED');
    await assert.rejects(sg.reserve(sku, 'gus', minter.mint(sku, 'gus'), 'a'), Fenced);
    await assert.rejects(sg.commit(r.token), (e) => e instanceof Fenced && e.code === 'FENCED');
  });

  it('calls whose connections are killed under them are retried with the same request id', async () => {
    const sku = await sale({ total: 400 });
    const c = new Stockgate({ addr: env.addr, connections: 8 });
    const [host, port] = env.addr.split(':');
    const admin = new Redis({ host, port: Number(port) });
    await c.ready();
    let killing = true;
    let kills = 0;
    const killer = (async () => {
      // Only this client's connections (other tests' and the sweeper's stay up).
      while (killing) {
        for (const conn of c.conns) {
          const s = conn.stream;
          if (conn.status !== 'ready' || !s?.localPort) continue;
          kills += Number(await admin.call('CLIENT', 'KILL', 'ADDR', `${s.localAddress}:${s.localPort}`, 'SKIPME', 'yes'));
        }
        await sleep(15);
      }
    })();
    try {
      const results = await Promise.all(
        Array.from({ length: 400 }, async (_, i) => {
          await sleep(i % 50);
          return c.reserve(sku, `k${i}`, minter.mint(sku, `k${i}`), `req-${i}`);
        }),
      );
      killing = false;
      await killer;
      const tokens = new Set();
      for (const r of results) {
        assert.ok(r instanceof Reserved || r instanceof Replay, JSON.stringify(r));
        tokens.add(r.token);
      }
      assert.equal(tokens.size, 400);
      assert.ok(kills > 0, 'no connection was killed');
      // The resends are ioredis's own (it resends in-flight commands after a reconnect) or
      // this client's loop; either way with the same arguments, hence the same request id.
      const info = await c.saleInfo(sku);
      assert.deepEqual([info.reserved, info.available], [400, 0]);
    } finally {
      killing = false;
      await killer;
      admin.disconnect();
      await c.close();
    }
  });

  it('a call that can be retried fails only at its deadline, as Unavailable', async () => {
    // A port nothing listens on: the server's own port, on another loopback address.
    const port = env.addr.split(':')[1];
    const c = new Stockgate({ addr: `127.0.0.2:${port}`, deadlineMs: 800 });
    const t0 = Date.now();
    await assert.rejects(c.stock('X'), (e) => e instanceof Unavailable && e.code === 'UNAVAILABLE' && e.cause !== undefined);
    const took = Date.now() - t0;
    assert.ok(took >= 500 && took < 3000, `took ${took} ms`);
    await c.close();
  });

  it('the waiting room: open, join, admitted, reserve with its token; QUEUEFULL and BADTICKET typed', async () => {
    const sku = await sale({ total: 2 });
    await assert.rejects(sg.join(sku, 'alice'), (e) => e instanceof NoRoom && e.code === 'NOROOM');
    await assert.rejects(sg.roomInfo(sku), NoRoom);
    await sg.openRoom(sku, { rate: 1000, admitTtlMs: 60000, maxWaiting: 2 });
    await sg.openRoom(sku, { rate: 1000, admitTtlMs: 60000, maxWaiting: 2 }); // the same: fine
    await assert.rejects(sg.openRoom(sku, { maxWaiting: 3 }), Exists);
    await assert.rejects(sg.openRoom(sku, { rate: 0 }), CommandError);
    let info = await sg.roomInfo(sku);
    assert.deepEqual(
      [info.rate, info.admitTtlMs, info.maxWaiting, info.overadmitPermille, info.waiting, info.soldOut],
      [1000, 60000, 2, 1000, 0, false],
    );

    // Two units: the first two are admitted as they join, two wait, the fifth finds it full.
    const t = {};
    for (const u of ['alice', 'bob', 'carol', 'dave']) t[u] = await sg.join(sku, u);
    assert.deepEqual(
      Object.values(t).map((x) => x.position),
      [0, 0, 1, 2],
    );
    assert.deepEqual(await sg.join(sku, 'alice'), t.alice, 'a repeated join answers the same place');
    await assert.rejects(
      sg.join(sku, 'eve'),
      (e) => e instanceof QueueFull && e.code === 'QUEUEFULL' && e.maxWaiting === 2,
    );
    info = await sg.roomInfo(sku);
    assert.deepEqual([info.waiting, info.admitted, info.open], [2, 2, true]);
    const carol = await sg.status(sku, 'carol', t.carol.ticket);
    assert.equal(carol.kind, 'waiting');
    assert.equal(carol.position, 1);

    // Tickets of another user, altered or garbage are refused, typed.
    await assert.rejects(
      sg.status(sku, 'bob', t.alice.ticket),
      (e) => e instanceof BadTicket && e.code === 'BADTICKET' && !e.stale,
    );
    const parts = t.bob.ticket.split('|');
    parts[3] = 'carol';
    await assert.rejects(sg.status(sku, 'carol', parts.join('|')), BadTicket);
    await assert.rejects(sg.status(sku, 'bob', 't1|nope'), BadTicket);

    // The admitted buyer's token passes RESERVE through the package's reserve.
    const a = await sg.status(sku, 'alice', t.alice.ticket);
    assert.equal(a.kind, 'admitted', JSON.stringify(a));
    assert.ok(a.untilMs > Date.now() + 50000);
    const hold = await sg.reserve(sku, 'alice', a.admission, 'order-1');
    assert.ok(hold instanceof Reserved, JSON.stringify(hold));
    assert.deepEqual(await sg.status(sku, 'alice', t.alice.ticket), { kind: 'reserved' });

    // A leave moves the line up; the hold released admits the head of it.
    assert.equal(await sg.leave(sku, 'carol'), true);
    assert.equal(await sg.leave(sku, 'carol'), false);
    assert.deepEqual(await sg.status(sku, 'carol', t.carol.ticket), { kind: 'left' });
    assert.equal((await sg.status(sku, 'dave', t.dave.ticket)).position, 1);
    assert.equal(await sg.release(hold.token), true);
    const d = await until('dave admitted', 5000, async () => {
      const s = await sg.status(sku, 'dave', t.dave.ticket);
      return s.kind === 'admitted' ? s : null;
    }, 20);
    assert.ok((await sg.reserve(sku, 'dave', d.admission, 'order-1')) instanceof Reserved);
  });

  it('the waiting room: stale tickets, TOOMANYJOINS, BEFORE-OPEN, EXPIRED, SOLDOUT', async () => {
    const many = await sale({ total: 100 });
    await sg.openRoom(many, { rate: 1000 });
    const first = await sg.join(many, 'zoe');
    assert.equal(await sg.leave(many, 'zoe'), true);
    const second = await sg.join(many, 'zoe');
    assert.notEqual(second.ticket, first.ticket);
    await assert.rejects(sg.status(many, 'zoe', first.ticket), (e) => e instanceof BadTicket && e.stale);
    assert.equal((await sg.status(many, 'zoe', second.ticket)).kind, 'admitted');
    for (let i = 0; i < 2; i++) {
      assert.equal(await sg.leave(many, 'zoe'), true);
      await sg.join(many, 'zoe');
    }
    assert.equal(await sg.leave(many, 'zoe'), true);
    await assert.rejects(sg.join(many, 'zoe'), (e) => e instanceof TooManyJoins && e.code === 'TOOMANYJOINS');

    const later = await sale();
    const opens = Date.now() + 3600000;
    await sg.openRoom(later, { opensAtMs: opens });
    const ann = await sg.join(later, 'ann');
    assert.equal(ann.position, 0);
    assert.deepEqual(await sg.status(later, 'ann', ann.ticket), { kind: 'before_open', opensAtMs: opens });
    assert.equal((await sg.roomInfo(later)).open, false);

    const one = await sale({ total: 1 });
    await sg.openRoom(one, { rate: 1000, admitTtlMs: 100 });
    const amy = await sg.join(one, 'amy');
    assert.equal((await sg.status(one, 'amy', amy.ticket)).kind, 'admitted');
    await until('amy expired', 5000, async () => (await sg.status(one, 'amy', amy.ticket)).kind === 'expired', 20);
    const ben = await sg.join(one, 'ben');
    const b = await until('ben admitted', 5000, async () => {
      const s = await sg.status(one, 'ben', ben.ticket);
      return s.kind === 'admitted' ? s : null;
    }, 20);
    const cal = await sg.join(one, 'cal');
    assert.equal((await sg.status(one, 'cal', cal.ticket)).kind, 'waiting');
    const hold = await sg.reserve(one, 'ben', b.admission, 'order-1');
    assert.equal(await sg.commit(hold.token), 'committed');
    await until('cal told SOLDOUT', 5000, async () => (await sg.status(one, 'cal', cal.ticket)).kind === 'soldout', 20);
    await assert.rejects(sg.join(one, 'dan'), (e) => e instanceof SoldOutError && e.code === 'SOLDOUT');
    assert.equal((await sg.roomInfo(one)).soldOut, true);
  });
});

// Against the real server (STOCKGATE_ADDR, STOCKGATE_SECRET_FILE): the tokens minted here
// are accepted, every typed result and error comes back as the server answers it, and calls
// whose connections are killed under them are retried with the same request id.

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { Redis } from 'ioredis';

import {
  AdmissionMinter,
  CommandError,
  Denied,
  Exists,
  Expired,
  Fenced,
  Limit,
  NoReservation,
  NoSale,
  Paused,
  Released,
  Replay,
  Reserved,
  SoldOut,
  Stockgate,
  Unavailable,
  mintAdmissionToken,
} from '../src/index.js';
import { env, needs, runId, sleep } from './env.js';

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
});

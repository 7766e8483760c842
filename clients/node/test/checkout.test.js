// The checkout flow over the ledger's functions, branch by branch, against the real server
// (STOCKGATE_ADDR) and the real ledger (STOCKGATE_DATABASE_URL, migrated): what the ledger
// records, what the server holds, and the mistakes the ledger refuses, whether they come
// through the package or through raw calls of the functions.

import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';

import {
  AdmissionMinter,
  Checkout,
  Hold,
  LedgerInvalidArgument,
  OrderConflict,
  OrderNotFound,
  OrderRefused,
  SoldOut,
  Stockgate,
  Unavailable,
  ledgerErrorFrom,
} from '../src/index.js';
import { connectionLost } from '../src/checkout.js';
import { env, needs, pgPool, runId, sleep } from './env.js';

const skip = needs('STOCKGATE_ADDR', 'STOCKGATE_SECRET_FILE', 'STOCKGATE_DATABASE_URL');

describe('the checkout over the ledger', { skip }, () => {
  /** @type {Stockgate} */
  let sg;
  /** @type {Checkout} */
  let co;
  /** @type {AdmissionMinter} */
  let minter;
  /** @type {import('pg').Pool} */
  let db;
  let n = 0;
  const S = () => `"${env.schema}"`;

  const sale = async (total, opts = {}) => {
    const sku = `NODE-CO-${runId}-${++n}`;
    await sg.createSale(sku, total, { shards: 1, ttlMs: 60000, ...opts });
    return sku;
  };

  const start = async (sku, user, { requestId = 'r1', qty = 1 } = {}) => {
    const h = await co.reserveAndRecord({ sku, user, admission: minter.mint(sku, user), requestId, qty });
    assert.ok(h instanceof Hold, JSON.stringify(h));
    return h;
  };

  const order = async (token) => {
    const r = await db.query(
      `SELECT status, qty, user_id, request_id, payment_ref,
              (extract(epoch from reservation_expires_at) * 1000)::bigint AS expires,
              (extract(epoch from reservation_created_at) * 1000)::bigint AS created
         FROM ${S()}.orders WHERE reservation_token = $1`,
      [token],
    );
    if (r.rows.length === 0) return null;
    const o = r.rows[0];
    return { ...o, expires: Number(o.expires), created: Number(o.created) };
  };

  const events = async (token) =>
    (
      await db.query(
        `SELECT from_status, to_status, actor FROM ${S()}.order_events
          WHERE reservation_token = $1 ORDER BY id`,
        [token],
      )
    ).rows.map((e) => [e.from_status, e.to_status, e.actor]);

  before(async () => {
    sg = new Stockgate({ addr: env.addr, connections: 4 });
    minter = AdmissionMinter.fromFile(env.secretFile);
    co = new Checkout({ stockgate: sg, databaseUrl: env.databaseUrl, schema: env.schema, poolSize: 4 });
    db = pgPool(2);
    await sg.ready();
  });
  after(async () => {
    await co.close();
    await db.end();
    await sg.close();
  });

  it('reserveAndRecord records the server hold; pay commits ledger then server; a paid order is not cancelled', async () => {
    const sku = await sale(10);
    const h = await start(sku, 'alice', { qty: 2 });
    const r = await sg.reservation(h.token);
    assert.ok(r);
    // The ledger records the server's own times and the hold's qty.
    assert.deepEqual(await order(h.token), {
      status: 'PENDING',
      qty: 2,
      user_id: 'alice',
      request_id: 'r1',
      payment_ref: null,
      expires: r.expiresAtMs,
      created: r.createdAtMs,
    });
    assert.deepEqual([h.qty, h.createdAtMs, h.expiresAtMs, h.replay], [2, r.createdAtMs, r.expiresAtMs, false]);
    const again = await start(sku, 'alice', { qty: 2 });
    assert.equal(again.token, h.token);
    assert.ok(again.replay && !again.alreadyCommitted);

    assert.deepEqual(await co.pay(h.token, 'pay-1', { moneyMoved: true }), {
      kind: 'committed',
      serverConfirmed: true,
    });
    assert.equal((await sg.reservation(h.token)).state, 'COMMITTED');
    const o = await order(h.token);
    assert.deepEqual([o.status, o.payment_ref], ['COMMITTED', 'pay-1']);
    // The same payment again: the ledger knows it, and the server's hold is this order's.
    assert.deepEqual(await co.pay(h.token, 'pay-1', { moneyMoved: true }), { kind: 'already_committed' });
    // A retry of the checkout after the payment.
    assert.ok((await start(sku, 'alice', { qty: 2 })).alreadyCommitted);
    assert.deepEqual(await events(h.token), [
      [null, 'PENDING', 'checkout'],
      ['PENDING', 'COMMITTED', 'payment'],
    ]);
    // The mistake: cancelling a paid order. The ledger refuses it, the units stay sold.
    await assert.rejects(co.cancel(h.token), (e) => {
      assert.ok(e instanceof OrderRefused, String(e));
      assert.equal(e.code, 'SG001');
      assert.equal(e.status, 'COMMITTED');
      assert.equal(e.token, h.token);
      return true;
    });
    const info = await sg.saleInfo(sku);
    assert.deepEqual([info.committed, info.reserved], [2, 0], 'a paid order stays sold');
  });

  it('cancel gives the units back at once; paying a cancelled order is refused or marked for refund', async () => {
    const sku = await sale(1);
    const h = await start(sku, 'bob');
    assert.equal(await sg.stock(sku), 0);
    assert.equal(await co.cancel(h.token), true);
    assert.equal(await sg.stock(sku), 1, 'units back at once');
    assert.equal((await sg.reservation(h.token)).state, 'RELEASED');
    assert.equal((await order(h.token)).status, 'CANCELLED');
    assert.equal(await co.cancel(h.token), false, 'already cancelled: nothing more to release');
    assert.deepEqual(await co.pay(h.token, 'p', { moneyMoved: false }), { kind: 'refused', status: 'CANCELLED' });
    assert.deepEqual(await co.pay(h.token, 'p', { moneyMoved: true }), {
      kind: 'refund_required',
      previous: 'CANCELLED',
    });
    // The same request again: the server replays the released hold, the ledger refuses it.
    await assert.rejects(
      co.reserveAndRecord({ sku, user: 'bob', admission: minter.mint(sku, 'bob'), requestId: 'r1' }),
      OrderRefused,
    );
    await assert.rejects(co.cancel(`{${sku}}${'b'.repeat(26)}`), (e) => e instanceof OrderNotFound && e.code === 'SG003');
  });

  it("a payment over a split sale's per-user limit is refused by the ledger", async () => {
    // Three sales recorded as the parts of one split parent (as `stockgate-sweeper split`
    // records them): each server keeps the limit per part, the ledger over the parent.
    const parts = [await sale(10, { limit: 2 }), await sale(10, { limit: 2 }), await sale(10, { limit: 2 })];
    const parent = `NODEL-${runId}-${n}`;
    for (const p of parts) {
      await db.query(`INSERT INTO ${S()}.sales (sku, initial_allocation, allocation) VALUES ($1, 10, 10)`, [p]);
    }
    await db.query(
      `INSERT INTO ${S()}.split_parents (parent, allocation, parts, per_user_limit) VALUES ($1, 30, 3, 2)`,
      [parent],
    );
    for (const [i, p] of parts.entries()) {
      await db.query(
        `INSERT INTO ${S()}.split_parts (parent, part_index, sku, history_id) VALUES ($1, $2, $3, 'test-history')`,
        [parent, i, p],
      );
    }
    const holds = [];
    for (const p of parts) holds.push(await start(p, 'erin', { qty: 2 }));
    assert.deepEqual(await co.pay(holds[0].token, 'p0', { moneyMoved: false }), {
      kind: 'committed',
      serverConfirmed: true,
    });
    assert.deepEqual(await co.pay(holds[1].token, 'p1', { moneyMoved: false }), { kind: 'over_limit' });
    assert.equal((await order(holds[1].token)).status, 'PENDING', 'a refusal changes nothing');
    assert.deepEqual(await co.pay(holds[2].token, 'p2', { moneyMoved: true }), {
      kind: 'refund_required',
      previous: 'PENDING',
    });
    let committed = 0;
    for (const p of parts) committed += (await sg.saleInfo(p)).committed;
    assert.equal(committed, 2, 'the limit over the parent');
  });

  it('a payment after the deadline is refused by the ledger, or marked for refund when money moved', async () => {
    const sku = await sale(5, { ttlMs: 300 });
    const h = await start(sku, 'carol');
    while (Date.now() <= h.expiresAtMs + 20) await sleep(20);
    const refused = await co.pay(h.token, 'late', { moneyMoved: false });
    assert.equal(refused.kind, 'refused');
    assert.ok(['PENDING', 'CANCELLED_BY_SWEEPER'].includes(refused.status), JSON.stringify(refused));
    const status = (await order(h.token)).status;
    assert.ok(['PENDING', 'CANCELLED_BY_SWEEPER'].includes(status), 'a refusal changes nothing');
    const out = await co.pay(h.token, 'late', { moneyMoved: true });
    // The sweeper of this run may cancel the late order between the read and this payment.
    assert.equal(out.kind, 'refund_required', JSON.stringify(out));
    assert.ok([status, 'CANCELLED_BY_SWEEPER'].includes(out.previous), JSON.stringify(out));
    assert.equal((await order(h.token)).status, 'REFUND_REQUIRED');
    assert.equal((await sg.saleInfo(sku)).committed, 0, 'a late payment sells nothing');
    assert.deepEqual(await co.pay(`{${sku}}${'c'.repeat(26)}`, 'p', { moneyMoved: false }), {
      kind: 'refused',
      status: null,
    });
    assert.equal(await co.markRefunded(h.token), 'REFUNDED');
    assert.equal(await co.markRefunded(h.token), 'ALREADY_REFUNDED');
  });

  it('the server released the units after the ledger committed: marked for refund', async () => {
    // Someone broke the ledger-first rule and released the hold on the server.
    const sku = await sale(5);
    const h = await start(sku, 'dave');
    assert.equal(await sg.release(h.token, { reason: 'admin' }), true);
    assert.deepEqual(await co.pay(h.token, 'pay-d', { moneyMoved: true }), {
      kind: 'refund_required',
      previous: 'COMMITTED',
    });
    assert.equal((await order(h.token)).status, 'REFUND_REQUIRED');
  });

  it('an order the server has no hold for: paid in the ledger, refused by the server, marked for refund', async () => {
    const sku = await sale(5);
    const token = `{${sku}}${'d'.repeat(26)}`;
    const now = Date.now();
    await db.query(`SELECT ${S()}.materialize_order($1, $2, $3, $4, 1, $5, $6)`, [
      token,
      sku,
      'erin',
      'r1',
      now + 60000,
      now,
    ]);
    assert.deepEqual(await co.pay(token, 'pay-e', { moneyMoved: true }), {
      kind: 'refund_required',
      previous: 'COMMITTED',
    });
    assert.equal((await order(token)).status, 'REFUND_REQUIRED');
  });

  it('a paid token whose server hold is another one: the retry does not commit it, the hold goes back', async () => {
    const sku = await sale(5);
    const h = await start(sku, 'frank');
    // The ledger's record of this token names another creation time and expiry: the hold
    // the payment was for is not the one the server holds.
    await db.query(
      `UPDATE ${S()}.orders SET reservation_created_at = reservation_created_at - interval '1 hour',
              reservation_expires_at = reservation_expires_at - interval '1 minute', status = 'COMMITTED',
              committed_at = now() WHERE reservation_token = $1`,
      [h.token],
    );
    assert.deepEqual(await co.pay(h.token, 'pay-f', { moneyMoved: true }), { kind: 'already_committed' });
    assert.equal((await sg.reservation(h.token)).state, 'RELEASED', 'the unpaid hold is given back, not sold');
    assert.equal((await sg.saleInfo(sku)).committed, 0);
  });

  it('extend moves both deadlines; SoldOut, Limit and Denied pass through unrecorded', async () => {
    const sku = await sale(1, { limit: 1 });
    const h = await start(sku, 'gina');
    const at = await co.extend(h.token, 120000);
    assert.ok(at > h.expiresAtMs);
    assert.equal((await order(h.token)).expires, at);
    const lim = await co.reserveAndRecord({ sku, user: 'gina', admission: minter.mint(sku, 'gina'), requestId: 'r2' });
    assert.equal(lim.kind, 'limit');
    assert.deepEqual([lim.liveTokens, lim.limit, lim.held], [[h.token], 1, 1]);
    const so = await co.reserveAndRecord({ sku, user: 'hal', admission: minter.mint(sku, 'hal'), requestId: 'r1' });
    assert.ok(so instanceof SoldOut);
    const d = await co.reserveAndRecord({ sku, user: 'hal', admission: minter.mint(sku, 'other'), requestId: 'r1' });
    assert.deepEqual([d.kind, d.reason], ['denied', 'wrong_user']);
    assert.equal((await db.query(`SELECT count(*)::int AS n FROM ${S()}.orders WHERE sku = $1`, [sku])).rows[0].n, 1);
  });

  it('concurrent buyers through one checkout: exactly the stock sold', async () => {
    const sku = await sale(3);
    const outs = await Promise.all(
      ['a', 'b', 'c', 'd'].map((u) =>
        co.reserveAndRecord({ sku, user: u, admission: minter.mint(sku, u), requestId: 'r1' }),
      ),
    );
    const holds = outs.filter((o) => o instanceof Hold);
    assert.equal(holds.length, 3);
    assert.equal(outs.filter((o) => o instanceof SoldOut).length, 1);
    assert.deepEqual(await co.pay(holds[0].token, 'p0', { moneyMoved: true }), { kind: 'committed', serverConfirmed: true });
    assert.equal(await co.cancel(holds[1].token), true);
    assert.deepEqual(await co.pay(holds[2].token, 'p2', { moneyMoved: false }), { kind: 'committed', serverConfirmed: true });
    const info = await sg.saleInfo(sku);
    assert.deepEqual([info.committed, info.reserved, info.available], [2, 0, 1]);
  });
});

// A ledger statement whose connection failed is sent again on a new connection: the
// checkout's Postgres is reached through a TCP proxy that refuses connections at first and
// forwards them after a while.
describe('the checkout after the ledger was unreachable', { skip }, () => {
  it('a payment sent while the ledger refuses connections is answered once it is back', async () => {
    const target = new URL(env.databaseUrl);
    const sockets = new Set();
    const proxy = net.createServer((c) => {
      sockets.add(c);
      const up = net.connect(Number(target.port || 5432), target.hostname);
      sockets.add(up);
      c.pipe(up).pipe(c);
      c.on('error', () => up.destroy());
      up.on('error', () => c.destroy());
    });
    // A free port, closed again: nothing listens there until the proxy starts.
    const port = await new Promise((ok) => {
      const probe = net.createServer().listen(0, '127.0.0.1', () => {
        const p = probe.address().port;
        probe.close(() => ok(p));
      });
    });
    const url = new URL(env.databaseUrl);
    url.host = `127.0.0.1:${port}`;
    const sg = new Stockgate({ addr: env.addr, deadlineMs: 10000 });
    const co = new Checkout({ stockgate: sg, databaseUrl: url.toString(), schema: env.schema, poolSize: 1 });
    try {
      const t = Date.now();
      const paying = co.pay(`{NODE-PROXY-${runId}}${'z'.repeat(26)}`, 'p', { moneyMoved: false });
      await sleep(400);
      await new Promise((ok) => proxy.listen(port, '127.0.0.1', ok));
      assert.deepEqual(await paying, { kind: 'refused', status: null });
      assert.ok(Date.now() - t >= 400, 'answered only once the ledger was reachable');
    } finally {
      await co.close();
      await sg.close();
      for (const s of sockets) s.destroy();
      await new Promise((ok) => proxy.close(ok));
    }
  });

  it('a ledger that stays unreachable ends the call at the deadline as Unavailable', async () => {
    const url = new URL(env.databaseUrl);
    url.host = '127.0.0.1:1';
    const sg = new Stockgate({ addr: env.addr, deadlineMs: 600 });
    const co = new Checkout({ stockgate: sg, databaseUrl: url.toString(), schema: env.schema, poolSize: 1 });
    try {
      const t = Date.now();
      await assert.rejects(co.cancel('{X}abc'), (e) => e instanceof Unavailable && e.code === 'UNAVAILABLE');
      assert.ok(Date.now() - t < 3000);
    } finally {
      await co.close();
      await sg.close();
    }
  });
});

// The mistakes a hand-written integration makes, sent as raw SQL calls of the ledger's
// functions (no package logic in between): the ledger itself refuses each one.
describe('the ledger refuses mistakes made through raw calls of its functions', { skip }, () => {
  /** @type {import('pg').Pool} */
  let db;
  const S = () => `"${env.schema}"`;
  const tok = (c) => `{NODE-RAW-${runId}}${c.repeat(26)}`;
  const sku = `NODE-RAW-${runId}`;
  const raw = async (text, values) => {
    try {
      return (await db.query(text, values)).rows[0];
    } catch (e) {
      throw ledgerErrorFrom(e) ?? e;
    }
  };
  const materialize = (token, user, expiresAtMs, createdAtMs, qty = 1) =>
    raw(`SELECT ${S()}.materialize_order($1, $2, $3, $4, $5, $6, $7) AS outcome`, [
      token,
      sku,
      user,
      `req-${user}`,
      qty,
      expiresAtMs,
      createdAtMs,
    ]);
  const pay = (token, ref, moneyMoved) =>
    raw(`SELECT outcome, previous_status FROM ${S()}.pay_order($1, $2, $3)`, [token, ref, moneyMoved]);

  before(() => {
    db = pgPool(2);
  });
  after(() => db.end());

  it('pay_order after the deadline: REFUSED without money, REFUND_REQUIRED with; never COMMITTED', async () => {
    const now = Date.now();
    const t = tok('a');
    assert.equal((await materialize(t, 'ann', now - 1000, now - 2000)).outcome, 'CREATED');
    assert.deepEqual(await pay(t, 'late-1', false), { outcome: 'REFUSED', previous_status: 'PENDING' });
    assert.deepEqual(await pay(t, 'late-1', true), { outcome: 'REFUND_REQUIRED', previous_status: 'PENDING' });
    const row = await raw(`SELECT status FROM ${S()}.orders WHERE reservation_token = $1`, [t]);
    assert.equal(row.status, 'REFUND_REQUIRED');
    // In time, the same function commits; a second call is the same payment.
    const t2 = tok('b');
    await materialize(t2, 'ben', now + 60000, now);
    assert.deepEqual(await pay(t2, 'p', true), { outcome: 'COMMITTED', previous_status: 'PENDING' });
    assert.equal((await pay(t2, 'p', true)).outcome, 'ALREADY_COMMITTED');
  });

  it('order_is_hold says no for a hold the payment was not for', async () => {
    const now = Date.now();
    const t = tok('c');
    await materialize(t, 'cat', now + 60000, now, 2);
    await pay(t, 'p', true);
    const same = (user, qty, created, expires) =>
      raw(`SELECT ${S()}.order_is_hold($1, $2, $3, $4, $5, $6) AS same`, [t, sku, user, qty, created, expires]);
    assert.equal((await same('cat', 2, now, now + 60000)).same, true);
    // A later hold for the same request: another creation time and another deadline.
    assert.equal((await same('cat', 2, now + 5, now + 60005)).same, false, 'another hold');
    // An EXTEND that reached the server but not the ledger: the creation time still says so.
    assert.equal((await same('cat', 2, now, now + 90000)).same, true);
    assert.equal((await same('cat', 1, now, now + 60000)).same, false, 'another qty');
    assert.equal((await same('dog', 2, now, now + 60000)).same, false, 'another user');
  });

  it('cancel_order of a paid order is refused (SG001); a conflicting materialize is SG002; bad input SG004', async () => {
    const now = Date.now();
    const t = tok('d');
    await materialize(t, 'dan', now + 60000, now);
    await pay(t, 'p', true);
    await assert.rejects(raw(`SELECT ${S()}.cancel_order($1)`, [t]), (e) => {
      assert.ok(e instanceof OrderRefused, String(e));
      assert.equal(e.status, 'COMMITTED');
      return true;
    });
    await assert.rejects(materialize(t, 'eve', now + 60000, now), OrderConflict);
    await assert.rejects(materialize(tok('e'), 'eve', now + 60000, now, 0), LedgerInvalidArgument);
    await assert.rejects(raw(`SELECT ${S()}.cancel_order($1)`, [tok('f')]), OrderNotFound);
    const row = await raw(`SELECT status FROM ${S()}.orders WHERE reservation_token = $1`, [t]);
    assert.equal(row.status, 'COMMITTED', 'the refusals changed nothing');
  });
});

describe('ledger errors (local)', () => {
  it('connectionLost tells a failed connection from a failed statement', () => {
    for (const e of [
      { code: '08006', message: 'connection failure' },
      { code: '57P01', message: 'terminating connection due to administrator command' },
      { code: 'ECONNREFUSED', message: 'connect ECONNREFUSED 127.0.0.1:5432' },
      { message: 'Connection terminated unexpectedly' },
    ]) {
      assert.equal(connectionLost(e), true, JSON.stringify(e));
    }
    for (const e of [
      { code: 'SG001', message: 'order x is COMMITTED' },
      { code: '42883', message: 'function does not exist' },
      { code: '23505', message: 'duplicate key' },
      null,
    ]) {
      assert.equal(connectionLost(e), false, JSON.stringify(e));
    }
  });

  it('a ledger SQLSTATE becomes its typed error, anything else stays as it is', () => {
    const e = ledgerErrorFrom({ code: 'SG001', message: 'order {S}abc is CANCELLED_BY_SWEEPER: cannot pay' });
    assert.ok(e instanceof OrderRefused);
    assert.deepEqual([e.code, e.token, e.status], ['SG001', '{S}abc', 'CANCELLED_BY_SWEEPER']);
    assert.ok(ledgerErrorFrom({ code: 'SG003', message: 'x' }) instanceof OrderNotFound);
    assert.equal(ledgerErrorFrom({ code: '23505', message: 'x' }), null);
  });
});

// A server with users (STOCKGATE_AUTH_ADDR; `user:password` of an admin and a checkout role
// in STOCKGATE_AUTH_ADMIN / STOCKGATE_AUTH_CHECKOUT): the checkout role may not say
// `COMMIT ... VERIFIED`, so its first payment meets -NOPERM and the checkout falls back to
// the plain COMMIT, for that payment and every later one.
const authSkip = needs(
  'STOCKGATE_AUTH_ADDR',
  'STOCKGATE_AUTH_SECRET_FILE',
  'STOCKGATE_AUTH_ADMIN',
  'STOCKGATE_AUTH_CHECKOUT',
  'STOCKGATE_DATABASE_URL',
);

describe('the checkout on a role that may not send COMMIT VERIFIED', { skip: authSkip }, () => {
  const as = (pair) => {
    const i = pair.indexOf(':');
    return new Stockgate({ addr: process.env.STOCKGATE_AUTH_ADDR, username: pair.slice(0, i), password: pair.slice(i + 1) });
  };

  it('NOPERM once, then plain COMMIT: the payments are sold and confirmed', async () => {
    const admin = as(process.env.STOCKGATE_AUTH_ADMIN);
    const shop = as(process.env.STOCKGATE_AUTH_CHECKOUT);
    const adminCo = new Checkout({ stockgate: admin, databaseUrl: env.databaseUrl, schema: env.schema, poolSize: 2 });
    const co = new Checkout({ stockgate: shop, databaseUrl: env.databaseUrl, schema: env.schema, poolSize: 2 });
    const minter = AdmissionMinter.fromFile(process.env.STOCKGATE_AUTH_SECRET_FILE);
    const sku = `NODE-AUTH-${runId}`;
    try {
      await admin.createSale(sku, 5, { shards: 1, ttlMs: 60000 });
      const start = async (c, user) => {
        const h = await c.reserveAndRecord({ sku, user, admission: minter.mint(sku, user), requestId: 'r1' });
        assert.ok(h instanceof Hold, JSON.stringify(h));
        return h;
      };
      const h1 = await start(co, 'ivy');
      assert.equal(co.plainCommitOnly, false);
      assert.deepEqual(await co.pay(h1.token, 'p1', { moneyMoved: true }), { kind: 'committed', serverConfirmed: true });
      assert.equal(co.plainCommitOnly, true, 'the checkout role met NOPERM for VERIFIED');
      assert.equal((await shop.reservation(h1.token)).state, 'COMMITTED');
      const h2 = await start(co, 'jon');
      assert.deepEqual(await co.pay(h2.token, 'p2', { moneyMoved: true }), { kind: 'committed', serverConfirmed: true });
      // The admin role may say VERIFIED: no fallback.
      const h3 = await start(adminCo, 'kim');
      assert.deepEqual(await adminCo.pay(h3.token, 'p3', { moneyMoved: true }), {
        kind: 'committed',
        serverConfirmed: true,
      });
      assert.equal(adminCo.plainCommitOnly, false);
      assert.equal((await admin.saleInfo(sku)).committed, 3);

      // The ledger took the payment in time but the server's deadline has passed: the
      // plain COMMIT meets -EXPIRED, the sale stands (the sweeper, which may say VERIFIED,
      // commits it on the server) and the caller is told the server is not confirmed yet.
      const late = `${sku}-L`;
      await admin.createSale(late, 2, { shards: 1, ttlMs: 300 });
      const h4 = await co.reserveAndRecord({ sku: late, user: 'lee', admission: minter.mint(late, 'lee'), requestId: 'r1' });
      assert.ok(h4 instanceof Hold);
      const db = pgPool(1);
      try {
        await db.query(
          `UPDATE "${env.schema}".orders SET reservation_expires_at = now() + interval '1 minute'
            WHERE reservation_token = $1`,
          [h4.token],
        );
      } finally {
        await db.end();
      }
      while (Date.now() <= h4.expiresAtMs + 20) await sleep(20);
      assert.deepEqual(await co.pay(h4.token, 'p4', { moneyMoved: true }), { kind: 'committed', serverConfirmed: false });
      assert.equal((await shop.reservation(h4.token)).state, 'RESERVED', 'left to the sweeper');
    } finally {
      await co.close();
      await adminCo.close();
      await shop.close();
      await admin.close();
    }
  });
});

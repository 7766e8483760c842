// A failover during a sale: a 3-member Raft group (STOCKGATE_GROUP_ADDRS), reached through
// the Sentinel interface its members answer (service name `stockgate`). Two clients, one
// with several connections, reserve and commit without pause; once the sale is in flight
// this test writes the signal file (STOCKGATE_FAILOVER_SIGNAL), the harness
// (tests/clients/node_package.rs) `kill -9`s the leader, restarts it and writes `<signal>.done`.
//
// The package finds the new leader and sends every interrupted call again with the same
// arguments (a RESERVE with the same request id answers REPLAY if its first send took
// effect): no error reaches the application, and every acknowledged hold and commit is on
// the new leader afterwards, once.

import assert from 'node:assert/strict';
import { existsSync, writeFileSync } from 'node:fs';
import { it } from 'node:test';

import { Redis } from 'ioredis';

import { AdmissionMinter, Replay, Reserved, Stockgate } from '../src/index.js';
import { env, needs, runId, sleep } from './env.js';

const TOTAL = 1000000;
const WORKERS_PER_CLIENT = 8;

/** The leader's address as the group's Sentinel interface names it (any member that answers). */
async function leaderAddr(addrs) {
  for (const a of addrs) {
    const i = a.lastIndexOf(':');
    const r = new Redis({ host: a.slice(0, i), port: Number(a.slice(i + 1)), lazyConnect: true, retryStrategy: () => null });
    r.on('error', () => {});
    try {
      await r.connect();
      const [host, port] = await r.call('SENTINEL', 'get-master-addr-by-name', 'stockgate');
      if (host) return `${host}:${port}`;
    } catch {
      // that member is down or has no leader yet: ask the next
    } finally {
      r.disconnect();
    }
  }
  return null;
}

const skip = needs('STOCKGATE_GROUP_ADDRS', 'STOCKGATE_FAILOVER_SIGNAL', 'STOCKGATE_SECRET_FILE');

it('a sale through a leader kill: no error reaches the application, every ack is on the new leader', { skip, timeout: 150000 }, async () => {
  const addrs = env.groupAddrs.split(',');
  const signal = env.failoverSignal;
  const minter = AdmissionMinter.fromFile(env.secretFile);
  const sku = `FAIL-NODE-${runId}`;
  const clients = [
    new Stockgate({ sentinels: addrs, name: 'stockgate', connections: 4, deadlineMs: 30000 }),
    new Stockgate({ sentinels: addrs, name: 'stockgate', connections: 1, deadlineMs: 30000 }),
  ];
  const acks = [];
  const errors = [];
  let stop = false;
  try {
    await Promise.all(clients.map((c) => c.ready()));
    await clients[0].createSale(sku, TOTAL, { ttlMs: 600000 });
    const before = await leaderAddr(addrs);
    // Every connection is to lose its leader: counted per connection.
    const closes = new Map();
    for (const c of clients) for (const r of c.conns) r.on('close', () => closes.set(r, (closes.get(r) ?? 0) + 1));
    assert.ok(before, 'no leader named by the group');

    const buyer = async (c, name) => {
      let i = 0;
      try {
        while (!stop) {
          const user = `${name}-${i}`;
          const requestId = `req-${user}`;
          const out = await c.reserve(sku, user, minter.mint(sku, user, { ttlMs: 600000 }), requestId);
          assert.ok(out instanceof Reserved || out instanceof Replay, `${requestId}: ${JSON.stringify(out)}`);
          const commit = i % 3 === 0;
          if (commit) await c.commit(out.token);
          acks.push({ requestId, token: out.token, commit, replay: out instanceof Replay });
          i += 1;
        }
      } catch (e) {
        errors.push(`${name}: ${e?.stack ?? e}`);
      }
    };
    const buyers = clients.flatMap((c, ci) =>
      Array.from({ length: WORKERS_PER_CLIENT }, (_, w) => buyer(c, `c${ci}w${w}`)),
    );
    const waitFor = async (what, ms, cond) => {
      const end = Date.now() + ms;
      while (!cond()) {
        assert.deepEqual(errors, []);
        assert.ok(Date.now() < end, `${what}: not within ${ms} ms`);
        await sleep(20);
      }
    };
    let atSignal = 0;
    let atDone = 0;
    try {
      await waitFor('the sale in flight', 30000, () => acks.length >= 300);
      atSignal = acks.length;
      writeFileSync(signal, `${sku}\n`);
      await waitFor("the harness's kill and restart", 60000, () => existsSync(`${signal}.done`));
      atDone = acks.length;
      // The sale goes on after the failover, on the new leader.
      await waitFor('the sale after the failover', 30000, () => acks.length >= atDone + 300);
    } finally {
      stop = true;
      await Promise.all(buyers);
    }
    assert.deepEqual(errors, [], 'an error reached the application');

    const after = await leaderAddr(addrs);
    assert.ok(after && after !== before, `the leader did not change (${before} -> ${after})`);
    // The calls a lost connection interrupted are sent again by ioredis once it has
    // reconnected (its unfulfilled commands), or by the client's retry loop when ioredis
    // gave up on them (`retries`); either way with the same arguments.
    const retries = clients.reduce((s, c) => s + c.retries, 0);
    const conns = clients.flatMap((c) => c.conns);
    assert.ok(
      conns.every((r) => (closes.get(r) ?? 0) > 0),
      'a connection never lost the leader: the kill did not reach the clients',
    );
    // Every connection of both clients follows the new leader.
    for (const c of clients) {
      for (const r of c.conns) {
        assert.equal(`${r.stream?.remoteAddress}:${r.stream?.remotePort}`, after, 'a connection on the old leader');
      }
    }

    const tokens = acks.map((a) => a.token);
    assert.equal(new Set(tokens).size, tokens.length, 'a token handed out twice');
    assert.equal(new Set(acks.map((a) => a.requestId)).size, acks.length);

    // Every acknowledged hold, and every acknowledged commit, is on the new leader.
    const c = clients[0];
    const missing = [];
    for (const a of acks) {
      const r = await c.reservation(a.token);
      const want = a.commit ? 'COMMITTED' : 'RESERVED';
      if (r === null || r.state !== want || r.requestId !== a.requestId) missing.push({ a, r });
    }
    assert.equal(missing.length, 0, `${missing.length} acknowledged holds not as acknowledged, e.g. ${JSON.stringify(missing.slice(0, 3))}`);
    const info = await c.saleInfo(sku);
    const committed = acks.filter((a) => a.commit).length;
    assert.deepEqual([info.reserved, info.committed], [acks.length - committed, committed], JSON.stringify(info));
    assert.equal(info.available + info.reserved + info.committed, TOTAL);
    const replays = acks.filter((a) => a.replay).length;
    console.log(
      `failover: ${acks.length} holds acknowledged (${atSignal} before the signal, ${atDone} at done), ` +
        `${committed} committed, ${replays} answered REPLAY after a retry, ${retries} retries; leader ${before} -> ${after}`,
    );
  } finally {
    stop = true;
    await Promise.all(clients.map((c) => c.close()));
  }
});

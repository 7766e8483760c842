// Live counts over RESP (docs/protocol.md section 4a, "Live counts over RESP") against the
// real server (STOCKGATE_ADDR, STOCKGATE_SECRET_FILE): the counts at once, a RESERVE and a
// ROOM.JOIN showing up, a buyer's place moving up when the buyer ahead leaves, and refused
// subscriptions rejecting with the package's typed errors; and the payload's parsing.

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import {
  AdmissionMinter,
  BadTicket,
  NoRoom,
  NoSale,
  ProtocolMismatch,
  Stockgate,
  parseLive,
} from '../src/index.js';
import { env, needs, runId } from './env.js';

const COUNTS = { sku: 'S1', available: 940, held: 12, sold: 48, waiting: 1500, admitted: 30, room: true, state: 'OPEN' };

describe('live counts payloads', () => {
  it('parse into counts and places; other shapes are ProtocolMismatch', () => {
    assert.deepEqual(parseLive(JSON.stringify(COUNTS)), COUNTS);
    assert.deepEqual(parseLive(Buffer.from(JSON.stringify(COUNTS))), COUNTS);
    const places = [
      [{ status: 'WAITING', position: 3, eta_ms: 1200 }, { kind: 'waiting', position: 3, etaMs: 1200 }],
      [{ status: 'ADMITTED', until_ms: 17 }, { kind: 'admitted', untilMs: 17 }],
      [{ status: 'BEFORE-OPEN', opens_at_ms: 99 }, { kind: 'before_open', opensAtMs: 99 }],
      [{ status: 'RESERVED' }, { kind: 'reserved' }],
      [{ status: 'SOLDOUT' }, { kind: 'soldout' }],
      [{ status: 'EXPIRED' }, { kind: 'expired' }],
      [{ status: 'LEFT' }, { kind: 'left' }],
      [{ status: 'GONE' }, { kind: 'gone' }],
    ];
    for (const [you, want] of places) {
      assert.deepEqual(parseLive(JSON.stringify({ ...COUNTS, you })), { ...COUNTS, you: want });
    }
    const { held: _held, ...noHeld } = COUNTS;
    for (const bad of [
      'not json',
      '[1]',
      JSON.stringify(noHeld),
      JSON.stringify({ ...COUNTS, held: '12' }),
      JSON.stringify({ ...COUNTS, room: 1 }),
      JSON.stringify({ ...COUNTS, you: { status: 'WAITING', position: 1 } }),
      JSON.stringify({ ...COUNTS, you: { status: 'LOST' } }),
      JSON.stringify({ ...COUNTS, you: 'WAITING' }),
      42,
    ]) {
      assert.throws(() => parseLive(bad), ProtocolMismatch, String(bad));
    }
  });
});

/** The messages a watch got, and a way to wait for one that matches. */
function inbox() {
  const got = [];
  let wake = () => {};
  return {
    got,
    push(c) {
      got.push(c);
      wake();
    },
    /** Resolves with the first message (from `from` on) for which `ok` holds. */
    async until(what, ok, from = 0, ms = 5000) {
      const end = Date.now() + ms;
      for (let i = from; ; ) {
        for (; i < got.length; i++) if (ok(got[i])) return got[i];
        const left = end - Date.now();
        if (left <= 0) throw new Error(`${what}: not within ${ms} ms; got ${JSON.stringify(got)}`);
        await new Promise((r) => {
          const t = setTimeout(r, left);
          wake = () => {
            clearTimeout(t);
            r();
          };
        });
      }
    },
  };
}

describe('live counts against the server', { skip: needs('STOCKGATE_ADDR', 'STOCKGATE_SECRET_FILE') }, () => {
  /** @type {Stockgate} */
  let sg;
  let n = 0;
  const sku = () => `NODE-LIVE-${runId}-${++n}`;

  before(async () => {
    sg = new Stockgate({ addr: env.addr });
    await sg.ready();
  });
  after(() => sg.close());

  it('watchSale: the counts at once, then a RESERVE and a COMMIT', async () => {
    const s = sku();
    await sg.createSale(s, 5, { shards: 1, ttlMs: 60000 });
    const box = inbox();
    const w = await sg.watchSale(s, (c) => box.push(c));
    try {
      const first = await box.until('the counts now', () => true);
      assert.deepEqual(first, { sku: s, available: 5, held: 0, sold: 0, waiting: 0, admitted: 0, room: false, state: 'OPEN' });
      const minter = AdmissionMinter.fromFile(env.secretFile);
      const r = await sg.reserve(s, 'alice', minter.mint(s, 'alice'), 'order-1', { qty: 2 });
      assert.equal(r.kind, 'reserved');
      const held = await box.until('the reserve', (c) => c.held === 2);
      assert.equal(held.available, 3);
      assert.equal(await sg.commit(r.token), 'committed');
      assert.equal((await box.until('the commit', (c) => c.sold === 2)).held, 0);
    } finally {
      await w.close();
    }
    assert.equal(w.closed, true);
  });

  it('watchPlace: WAITING at 2, then 1 once the buyer ahead leaves; joins show on the sale', async () => {
    const s = sku();
    await sg.createSale(s, 1, { shards: 1, ttlMs: 60000 });
    await sg.openRoom(s, { rate: 1000, windowMs: 0 });
    const sale = inbox();
    const ws = await sg.watchSale(s, (c) => sale.push(c));
    let wp;
    try {
      const first = await sale.until('the counts now', () => true);
      assert.deepEqual([first.room, first.waiting, first.admitted], [true, 0, 0]);
      await sg.join(s, 'a');
      await sale.until("a's join", (c) => c.admitted === 1);
      await sg.join(s, 'b');
      const c = await sg.join(s, 'c');
      assert.equal(c.position, 2);
      await sale.until('b and c waiting', (x) => x.waiting === 2);
      const place = inbox();
      wp = await sg.watchPlace(c.ticket, (x) => place.push(x));
      const now = await place.until('the place now', () => true);
      assert.equal(now.sku, s);
      assert.deepEqual([now.you.kind, now.you.position], ['waiting', 2]);
      assert.equal(await sg.leave(s, 'a'), true);
      const moved = await place.until('c moved up', (x) => x.you?.kind === 'waiting' && x.you.position === 1);
      assert.deepEqual([moved.waiting, moved.admitted], [1, 1]);
      assert.equal(await sg.leave(s, 'c'), true);
      await place.until('c left', (x) => x.you?.kind === 'left');
    } finally {
      await ws.close();
      await wp?.close();
    }
  });

  it('refused watches reject typed: NoSale, NoRoom, BadTicket', async () => {
    const s = sku();
    await assert.rejects(sg.watchSale(`${s}-NONE`, () => {}), (e) => e instanceof NoSale && e.code === 'NOSALE');
    await sg.createSale(s, 3, { shards: 1 });
    await assert.rejects(sg.watchPlace(`t1|k|${s}|u|0|sig`, () => {}), NoRoom);
    await sg.openRoom(s, { rate: 1000 });
    const real = await sg.join(s, 'u');
    const parts = real.ticket.split('|');
    parts[3] = 'mallory';
    for (const forged of [parts.join('|'), 't1|nope', 'garbage']) {
      await assert.rejects(
        sg.watchPlace(forged, () => {}),
        (e) => e instanceof BadTicket && e.code === 'BADTICKET' && e.detail.startsWith('ticket refused'),
        forged,
      );
    }
    const box = inbox();
    const w = await sg.watchPlace(real.ticket, (c) => box.push(c));
    try {
      assert.equal((await box.until('the place now', () => true)).you.kind, 'admitted');
    } finally {
      await w.close();
    }
    assert.throws(() => sg.watchSale(s), TypeError);
  });
});

// reserveSplit (docs/cluster.md, "A split sale"): the same home as the Rust and Python
// clients for the shared vectors (tests/split/vectors.json), and, against the real server,
// a buyer whose home part is sold out is served by the next part.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';

import { AdmissionMinter, Stockgate, homePart, probeOrder, reserveSplit, userHash } from '../src/index.js';
import { env, needs, runId } from './env.js';

const vectors = JSON.parse(
  readFileSync(new URL('../../../tests/split/vectors.json', import.meta.url), 'utf8'),
);

describe('split: shared vectors', () => {
  it('hashes and homes as Rust and Python do', () => {
    for (const [user, h] of vectors.hashes) assert.equal(userHash(user), h, user);
    for (const [user, of3, of5] of vectors.homes) {
      assert.deepEqual([homePart(user, 3), homePart(user, 5)], [of3, of5], user);
    }
    assert.deepEqual(probeOrder('a', 5), [0, 1, 2]);
    assert.deepEqual(probeOrder('a', 2), [0, 1]);
  });
});

describe('split: against the server', { skip: needs('STOCKGATE_ADDR', 'STOCKGATE_SECRET_FILE') }, () => {
  /** @type {Stockgate} */
  let sg;
  /** @type {AdmissionMinter} */
  let minter;
  before(async () => {
    sg = new Stockgate({ addr: env.addr, connections: 2 });
    minter = AdmissionMinter.fromFile(env.secretFile);
    await sg.ready();
  });
  after(() => sg.close());

  it('falls over to the next part when the home is sold out', async () => {
    const parent = `NODE-SPLIT-${runId}`;
    const parts = [0, 1, 2].map((i) => `${parent}.p${i}-0`);
    for (const p of parts) await sg.createSale(p, 2, { shards: 1, ttlMs: 60000, limit: 1 });
    const admission = (user) => (sku) => minter.mint(sku, user);
    // "user-7" is homed on part 0 of 3; part 0 is sold out.
    assert.equal(homePart('user-7', 3), 0);
    for (const u of ['o1', 'o2']) {
      assert.equal((await sg.reserve(parts[0], u, minter.mint(parts[0], u), 'x')).kind, 'reserved');
    }
    const moved = await reserveSplit(sg, parent, parts, 'user-7', 1, { admission: admission('user-7'), requestId: 'a' });
    assert.deepEqual([moved.part, moved.sku, moved.tried, moved.outcome.kind], [1, parts[1], [0, 1], 'reserved']);
    // The limit (1 per part) on the part that answered is final: no third probe.
    const again = await reserveSplit([sg, sg, sg], parent, parts, 'user-7', 1, { admission: admission('user-7'), requestId: 'b' });
    assert.deepEqual([again.part, again.tried, again.outcome.kind], [1, [0, 1], 'limit']);
  });
});

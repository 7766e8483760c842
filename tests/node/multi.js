// ioredis `multi()` and node-redis `multi()`, unmodified and in their default modes,
// against a running stockgate: replies in order, stock taken exactly once per RESERVE,
// a queue-time error aborts the transaction and takes nothing, a runtime error is one
// reply among the others.
//
// Usage: node tests/node/multi.js PORT DATA_DIR. Exits non-zero on any failure.
'use strict';

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const requireClient = require('./clients.js');
const Redis = requireClient('ioredis');
const { createClient } = requireClient('redis');

const [port, dataDir] = [Number(process.argv[2]), process.argv[3]];
const [kid, hexSecret] = fs.readFileSync(`${dataDir}/secret`, 'utf8').split(/\s+/);
const secret = Buffer.from(hexSecret, 'hex');

// docs/protocol.md "Admission token".
function mint(sku, user, ttlMs = 60000) {
  const payload = Buffer.from(`v1|${kid}|${sku}|${user}|${Date.now() + ttlMs}`);
  const sig = crypto.createHmac('sha256', secret).update(payload).digest();
  return `${payload.toString('base64url')}.${sig.toString('base64url')}`;
}

async function ioredisMulti() {
  // Defaults: lowercase command names, `info` as the ready check, RESP2.
  const r = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 1 });
  const sku = 'IOREDIS';
  assert.equal(await r.call('sale.create', sku, '10', 'SHARDS', '1'), 'OK');

  let tx = r.multi();
  for (const u of ['ann', 'bob', 'cat']) tx = tx.call('reserve', sku, u, mint(sku, u), 'req-1');
  const out = await tx.call('stock', sku).exec();
  for (const [err] of out) assert.equal(err, null);
  assert.deepEqual(out.slice(0, 3).map(([, v]) => v[0]), ['RESERVED', 'RESERVED', 'RESERVED']);
  assert.equal(out[3][1], 7);
  const tokens = out.slice(0, 3).map(([, v]) => v[1]);
  assert.equal(new Set(tokens).size, 3);
  assert.equal(await r.call('stock', sku), 7, 'one unit per RESERVE');

  // Queue-time error: the transaction is rejected and nothing runs.
  await assert.rejects(
    r.multi()
      .call('reserve', sku, 'dan', mint(sku, 'dan'), 'req-1')
      .call('nosuchcmd', 'x')
      .call('release', tokens[0])
      .exec(),
    (e) => /EXECABORT|unknown command/.test(String(e.message)),
  );
  assert.equal(await r.call('stock', sku), 7, 'aborted transaction took nothing');

  // Runtime error: one reply among the others.
  const mixed = await r.multi().call('stock', 'NOPE').call('release', tokens[0]).call('stock', sku).exec();
  assert.match(String(mixed[0][0]), /NOSALE/);
  assert.deepEqual(mixed.slice(1).map(([e, v]) => [e, v]), [[null, 1], [null, 8]]);
  await r.quit();
}

async function nodeRedisMulti(options, sku) {
  const c = createClient({ socket: { host: '127.0.0.1', port, reconnectStrategy: false }, ...options });
  c.on('error', () => {});
  await c.connect();
  assert.equal(await c.sendCommand(['SALE.CREATE', sku, '10', 'SHARDS', '1']), 'OK');

  let tx = c.multi();
  for (const u of ['ann', 'bob', 'cat']) tx = tx.addCommand(['RESERVE', sku, u, mint(sku, u), 'req-1']);
  const out = await tx.addCommand(['STOCK', sku]).exec();
  assert.deepEqual(out.slice(0, 3).map((v) => String(v[0])), ['RESERVED', 'RESERVED', 'RESERVED']);
  assert.equal(out[3], 7);
  const tokens = out.slice(0, 3).map((v) => String(v[1]));
  assert.equal(new Set(tokens).size, 3);
  assert.equal(await c.sendCommand(['STOCK', sku]), 7, 'one unit per RESERVE');

  // The same transaction again replays: same tokens, nothing more taken.
  tx = c.multi();
  for (const u of ['ann', 'bob', 'cat']) tx = tx.addCommand(['RESERVE', sku, u, mint(sku, u), 'req-1']);
  const again = await tx.exec();
  assert.deepEqual(again.map((v) => String(v[0])), ['REPLAY', 'REPLAY', 'REPLAY']);
  assert.deepEqual(again.map((v) => String(v[1])), tokens);
  assert.equal(await c.sendCommand(['STOCK', sku]), 7);

  await assert.rejects(
    c.multi()
      .addCommand(['RESERVE', sku, 'dan', mint(sku, 'dan'), 'req-1'])
      .addCommand(['NOSUCHCMD', 'x'])
      .addCommand(['RELEASE', tokens[0]])
      .exec(),
    (e) => /EXECABORT|unknown command/.test(String(e.message)),
  );
  assert.equal(await c.sendCommand(['STOCK', sku]), 7, 'aborted transaction took nothing');

  await assert.rejects(
    c.multi().addCommand(['STOCK', 'NOPE']).addCommand(['RELEASE', tokens[0]]).exec(),
    (e) => {
      // MultiErrorReply: the replies are all there; the error is in its place.
      assert.match(String(e.replies[0].message ?? e.replies[0]), /NOSALE/);
      assert.equal(e.replies[1], 1);
      return true;
    },
  );
  assert.equal(await c.sendCommand(['STOCK', sku]), 8, 'the runtime error did not stop RELEASE');
  await c.quit();
}

(async () => {
  await ioredisMulti();
  console.log('ioredis ok');
  await nodeRedisMulti({}, 'NODEREDIS2'); // node-redis 5's default: RESP2
  console.log('node-redis resp2 ok');
  await nodeRedisMulti({ RESP: 3 }, 'NODEREDIS3');
  console.log('node-redis resp3 ok');
  console.log('node clients ok');
})().catch((e) => {
  console.error(e);
  process.exit(1);
});

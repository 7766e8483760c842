// ioredis `Cluster` or node-redis `createCluster`, unmodified and in their default
// settings, buying while `stockgate-sweeper move-slots` moves the sales' slots to another
// group (tests/cluster/cluster_move.rs). Commands are sent the way docs/cluster.md "Per client"
// says: node-redis `cluster.sendCommand(sku, false, args)`, ioredis a `Command` given the
// sku's slot.
//
// Usage: node tests/node/cluster_move.js ioredis|node-redis PORT SECRET_FILE MODE ...
//   MODE `load SKUS(a,b,..) DURATION_SECS`: two buyers reserve one unit for a new user at
//     a time, round robin over the skus, committing every other hold, for DURATION
//     seconds. What the client gives up on is sent again by the caller with the same
//     request id (so each request reserves once), counted by the reply's first word.
//     Prints one JSON line per acknowledged hold, `{"token", "state", "at"}` (state as
//     the client last saw it, `at` the acknowledgement's wall-clock ms), then
//     `{"retried": {WORD: n}}` and `{"done": true}`.
//   MODE `probe SKU`: one RESERVE, no caller retry; prints `{"sending": true}` just
//     before it, then `{"reply": [...], "ms": n}` or `{"error": "...", "ms": n}` and
//     `{"done": true}`. The Rust test arranges what the
//     owner answers (`-TRYAGAIN` from a frozen sale, `-ASK` from a migrating slot).
'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const requireClient = require('./clients.js');

const [which, portArg, secretFile, mode, ...rest] = process.argv.slice(2);
const port = Number(portArg);
const [kid, hexSecret] = fs.readFileSync(secretFile, 'utf8').split(/\s+/);
const secret = Buffer.from(hexSecret, 'hex');

function mint(sku, user, ttlMs = 600000) {
  const payload = Buffer.from(`v1|${kid}|${sku}|${user}|${Date.now() + ttlMs}`);
  const sig = crypto.createHmac('sha256', secret).update(payload).digest();
  return `${payload.toString('base64url')}.${sig.toString('base64url')}`;
}

function say(obj) {
  process.stdout.write(`${JSON.stringify(obj)}\n`);
}

async function open() {
  const root = { host: '127.0.0.1', port };
  if (which === 'ioredis') {
    const Redis = requireClient('ioredis');
    const calculateSlot = requireClient('cluster-key-slot');
    const cluster = new Redis.Cluster([root]);
    await new Promise((resolve, reject) => {
      cluster.once('ready', resolve);
      cluster.once('error', reject);
    });
    return {
      keyed: (name, args) => {
        const cmd = new Redis.Command(name, args, { replyEncoding: 'utf8' });
        cmd.slot = calculateSlot(String(args[0]));
        return cluster.sendCommand(cmd);
      },
      close: () => cluster.disconnect(),
    };
  }
  const { createCluster } = requireClient('redis');
  const cluster = createCluster({ rootNodes: [{ url: `redis://${root.host}:${root.port}` }] });
  cluster.on('error', (e) => console.error('cluster error', e));
  await cluster.connect();
  return {
    keyed: (name, args) => cluster.sendCommand(String(args[0]), false, [name, ...args.map(String)]),
    close: () => cluster.close(),
  };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const retried = {};

// Sends again what the client gave up on (same arguments, so the same request id).
async function untilDone(f) {
  const deadline = Date.now() + 30000;
  for (;;) {
    try {
      return await f();
    } catch (e) {
      const word = String(e && e.message).split(' ')[0];
      if (Date.now() > deadline) throw e;
      retried[word] = (retried[word] || 0) + 1;
      await sleep(20);
    }
  }
}

async function buyer(c, tag, skus, end) {
  for (let n = 0; Date.now() < end; n++) {
    const sku = skus[n % skus.length];
    const user = `${tag}${n}`;
    const adm = mint(sku, user);
    const r = await untilDone(() => c.keyed('RESERVE', [sku, user, adm, `q${n}`]));
    if (r[0] !== 'RESERVED') throw new Error(`reserve ${sku} ${user}: ${r}`);
    const token = r[1];
    let state = 'RESERVED';
    if (n % 2 === 0) {
      const done = Number(await untilDone(() => c.keyed('COMMIT', [token])));
      // :0 only if an earlier COMMIT the client gave up on was in fact applied.
      if (done !== 1 && done !== 0) throw new Error(`commit ${token}: ${done}`);
      state = 'COMMITTED';
    }
    say({ token, state, at: Date.now() });
  }
}

async function load(c, skuList, secs) {
  const skus = skuList.split(',');
  const end = Date.now() + Number(secs) * 1000;
  await Promise.all(['x', 'y'].map((tag) => buyer(c, `${which}-${tag}`, skus, end)));
  say({ retried });
}

async function probe(c, sku) {
  say({ sending: true });
  const start = Date.now();
  try {
    const reply = await c.keyed('RESERVE', [sku, 'probe', mint(sku, 'probe'), 'p1']);
    say({ reply, ms: Date.now() - start });
  } catch (e) {
    say({ error: String(e && e.message), ms: Date.now() - start });
  }
}

async function main() {
  const c = await open();
  if (mode === 'load') await load(c, rest[0], rest[1]);
  else if (mode === 'probe') await probe(c, rest[0]);
  else throw new Error(`unknown mode ${mode}`);
  await c.close();
  say({ done: true });
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

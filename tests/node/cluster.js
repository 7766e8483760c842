// ioredis `Cluster` or node-redis `createCluster`, unmodified, against three stockgate
// groups in cluster mode (tests/clients/cluster_clients.rs): creates the sales, warms up, then
// reserves and commits for many users on every sale, the way docs/cluster.md tells each
// client to send a stockgate command so that it goes to the owning group in one hop:
// - node-redis: `cluster.sendCommand(sku, isReadonly, args)` (its first argument is the
//   key it routes on);
// - ioredis: a `Command` whose `slot` is the sku's (ioredis computes a command's slot
//   from its bundled list of Redis commands, which has no stockgate command, and sends
//   a command without a slot to a random node); `cluster.call()` also works, through a
//   `-MOVED` most of the time, which this script counts too.
//
// Usage: node tests/node/cluster.js ioredis|node-redis PORTS(a,b,c) SECRET_FILE SKUS(a,b,..) USERS
// Prints `MOVED_AFTER_WARMUP <n>` (redirections during the reserve/commit phase, from
// every node's INFO), `CALL_MOVED <n>` (ioredis: redirections of plain `call()`), and
// `cluster clients ok`. Exits non-zero on any failure.
'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const requireClient = require('./clients.js');

const [which, portList, secretFile, skuList, usersArg] = process.argv.slice(2);
const ports = portList.split(',').map(Number);
const skus = skuList.split(',');
const users = Number(usersArg);
const [kid, hexSecret] = fs.readFileSync(secretFile, 'utf8').split(/\s+/);
const secret = Buffer.from(hexSecret, 'hex');

function mint(sku, user, ttlMs = 600000) {
  const payload = Buffer.from(`v1|${kid}|${sku}|${user}|${Date.now() + ttlMs}`);
  const sig = crypto.createHmac('sha256', secret).update(payload).digest();
  return `${payload.toString('base64url')}.${sig.toString('base64url')}`;
}

function check(cond, what) {
  if (!cond) throw new Error(what);
}

async function open() {
  const nodes = ports.map((port) => ({ host: '127.0.0.1', port }));
  if (which === 'ioredis') {
    const Redis = requireClient('ioredis');
    const calculateSlot = requireClient('cluster-key-slot');
    const cluster = new Redis.Cluster(nodes);
    // The key is the sku (argv[1]), or the sku in a token's `{sku}` hash tag: both hash
    // to the sku's slot, so `calculateSlot(args[0])` is right for every command.
    const keyed = (name, args) => {
      const cmd = new Redis.Command(name, args, { replyEncoding: 'utf8' });
      cmd.slot = calculateSlot(String(args[0]));
      return cluster.sendCommand(cmd);
    };
    return {
      keyed,
      call: (name, args) => cluster.call(name, ...args),
      close: () => cluster.disconnect(),
    };
  }
  const { createCluster } = requireClient('redis');
  const cluster = createCluster({ rootNodes: nodes.map((n) => ({ url: `redis://${n.host}:${n.port}` })) });
  cluster.on('error', (e) => console.error('cluster error', e));
  await cluster.connect();
  const readonly = new Set(['STOCK', 'RESERVATION', 'SALE.INFO']);
  return {
    keyed: (name, args) => cluster.sendCommand(String(args[0]), readonly.has(name), [name, ...args.map(String)]),
    call: null,
    close: () => cluster.close(),
  };
}

// INFO from each node directly (a plain client per port), summed.
async function movedTotal() {
  const net = require('node:net');
  let total = 0;
  for (const port of ports) {
    const text = await new Promise((resolve, reject) => {
      const s = net.connect(port, '127.0.0.1');
      let buf = '';
      s.on('data', (d) => {
        buf += d.toString();
        if (/cluster_redirections_moved:\d+\r\n/.test(buf)) {
          s.end();
          resolve(buf);
        }
      });
      s.on('error', reject);
      s.write('INFO cluster\r\n');
    });
    total += Number(/cluster_redirections_moved:(\d+)/.exec(text)[1]);
  }
  return total;
}

async function main() {
  const c = await open();
  for (const sku of skus) {
    check((await c.keyed('SALE.CREATE', [sku, 100000])) === 'OK', `create ${sku}`);
  }
  // Warm-up: one read per sale (ioredis and node-redis learn the map on connect).
  for (const sku of skus) await c.keyed('STOCK', [sku]);
  const before = await movedTotal();
  let committed = 0;
  for (const sku of skus) {
    for (let u = 0; u < users; u++) {
      const user = `${which}-${u}`;
      const r = await c.keyed('RESERVE', [sku, user, mint(sku, user), `req-${u}`]);
      check(r[0] === 'RESERVED', `reserve ${sku} ${user}: ${r}`);
      if (u % 2 === 0) {
        check(Number(await c.keyed('COMMIT', [r[1]])) === 1, `commit ${r[1]}`);
        committed++;
      } else {
        const again = await c.keyed('RESERVE', [sku, user, mint(sku, user), `req-${u}`]);
        check(again[0] === 'REPLAY' && again[1] === r[1], `replay ${sku} ${user}`);
      }
    }
  }
  const after = await movedTotal();
  console.log(`MOVED_AFTER_WARMUP ${after - before}`);
  console.log(`COMMITTED ${committed}`);
  if (c.call) {
    const b = await movedTotal();
    for (const sku of skus) {
      const n = Number(await c.call('STOCK', [sku]));
      check(n === 100000 - users, `stock of ${sku} through call(): ${n}`);
    }
    console.log(`CALL_MOVED ${(await movedTotal()) - b}`);
  }
  await c.close();
  console.log('cluster clients ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

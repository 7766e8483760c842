// ioredis (`new Redis({ sentinels, name })`) or node-redis (`createSentinel`), in their
// default settings, pointed at the members of a stockgate Raft group as their
// "sentinels": reserves one unit per user without pause until told to stop (a line on
// stdin), while the test kills the leader. A RESERVE that fails is sent again with the
// same request id (a retry whose first send took effect answers REPLAY), as a checkout
// would; the client is never rebuilt or re-pointed.
//
// Usage: node tests/node/raft_clients.js ioredis|node-redis PORTS(a,b,c) NAME SECRET_FILE SKU
// Prints `AT <port>` (the server it talks to: at the start, after each retried call and
// every 20 reservations),
// `ACK <request_id> <token> <RESERVED|REPLAY>` per acknowledged RESERVE, and at the end
// `DONE <retries>`. Exits non-zero on any failure.
'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const readline = require('node:readline');
const requireClient = require('./clients.js');

const [which, ports, name, secretFile, sku] = process.argv.slice(2);
const [kid, hexSecret] = fs.readFileSync(secretFile, 'utf8').split(/\s+/);
const secret = Buffer.from(hexSecret, 'hex');
const sentinels = ports.split(',').map((p) => ({ host: '127.0.0.1', port: Number(p) }));

// docs/protocol.md "Admission token".
function mint(user, ttlMs = 600000) {
  const payload = Buffer.from(`v1|${kid}|${sku}|${user}|${Date.now() + ttlMs}`);
  const sig = crypto.createHmac('sha256', secret).update(payload).digest();
  return `${payload.toString('base64url')}.${sig.toString('base64url')}`;
}

// The same two calls in both clients' words.
async function open() {
  if (which === 'ioredis') {
    const Redis = requireClient('ioredis');
    const r = new Redis({ sentinels, name });
    return {
      call: (...args) => r.call(...args),
      info: () => r.info('server'),
      close: () => r.disconnect(),
    };
  }
  const { createSentinel } = requireClient('redis');
  const r = createSentinel({ name, sentinelRootNodes: sentinels });
  // Connection errors during the failover are reported here; the calls retry below.
  r.on('error', () => {});
  await r.connect();
  return {
    call: (...args) => r.sendCommand(false, args.map(String)),
    info: () => r.sendCommand(false, ['INFO', 'server']),
    close: () => r.close(),
  };
}

let retries = 0;
let stop = false;

async function port(c) {
  const m = /tcp_port:(\d+)/.exec(String(await c.info()));
  if (!m) throw new Error('INFO server has no tcp_port');
  return Number(m[1]);
}

async function reserve(c, i) {
  const user = `u-${i}`;
  const rid = `req-${i}`;
  const adm = mint(user);
  const deadline = Date.now() + 30000;
  let retried = false;
  for (;;) {
    try {
      const v = await c.call('RESERVE', sku, user, adm, rid);
      const word = String(v[0]);
      if (word !== 'RESERVED' && word !== 'REPLAY') throw new Error(`unexpected ${JSON.stringify(v)}`);
      // A client that resends on its own after a reconnect never fails a call: the
      // server is asked every 20 reservations as well.
      if (retried || i % 20 === 19) console.log(`AT ${await port(c)}`);
      console.log(`ACK ${rid} ${v[1]} ${word}`);
      return;
    } catch (e) {
      if (Date.now() > deadline) throw new Error(`${rid}: still failing after 30 s: ${e.message}`);
      retries++;
      retried = true;
      await new Promise((ok) => setTimeout(ok, 50));
    }
  }
}

async function main() {
  const rl = readline.createInterface({ input: process.stdin });
  rl.on('line', () => {
    stop = true;
  });
  const c = await open();
  console.log(`AT ${await port(c)}`);
  for (let i = 0; !stop; i++) await reserve(c, i);
  rl.close();
  console.log(`DONE ${retries}`);
  await c.close();
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);

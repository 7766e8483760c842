// ioredis over TLS (the `tls` option) against stockgate's --tls-port: runs one command
// and prints its reply.
//
// Usage: node tests/node/tls.js PORT CA_FILE CERT_FILE|- KEY_FILE|- CMD ARG...
// Exits 1, printing the error, when the connection or the command fails.
'use strict';

const fs = require('node:fs');
const requireClient = require('./clients.js');
const Redis = requireClient('ioredis');

const [port, ca, cert, key, ...cmd] = process.argv.slice(2);
const tls = { ca: fs.readFileSync(ca) };
if (cert !== '-') tls.cert = fs.readFileSync(cert);
if (key !== '-') tls.key = fs.readFileSync(key);

const r = new Redis({
  host: '127.0.0.1',
  port: Number(port),
  tls,
  // Fail once instead of reconnecting for ever: the test wants the first answer.
  retryStrategy: () => null,
  maxRetriesPerRequest: 0,
  lazyConnect: true,
});
r.on('error', () => {});
const timer = setTimeout(() => {
  console.log('error: timed out');
  process.exit(1);
}, 10000);

(async () => {
  try {
    await r.connect();
    const out = await r.call(...cmd);
    console.log(Array.isArray(out) ? out.join(',') : String(out));
    clearTimeout(timer);
    r.disconnect();
  } catch (e) {
    console.log(`error: ${e.message}`);
    process.exit(1);
  }
})();

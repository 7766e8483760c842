// The Node package `stockgate` (clients/node, from its source) in cluster mode
// (tests/clients/cluster_packages.rs).
//
// Usage:
//   node package_cluster.mjs buy SEED SECRET_FILE SKUS(a,b,..) DURATION_S PARTS(a,b,c)
//     ONE `new Stockgate({ cluster: SEED })` reserves one unit for a new user at a time,
//     round robin over the skus, committing every other hold, while the harness moves a
//     slot; then eight buyers `reserveSplit` a split sale whose three parts (one per group,
//     2 units each, created here) are on different groups; prints `ACK <token> <0|1>` per
//     acknowledged hold, `RETRIED <n>`, `SPLIT_RESERVED <n>`, `buyer ok`.
//   node package_cluster.mjs hold ADDR SECRET_FILE DATABASE_URL SKU USER
//     reserves and records a hold through a single-address client; prints `TOKEN <t>`.
//   node package_cluster.mjs pay plain|cluster ADDR SECRET_FILE DATABASE_URL TOKEN
//     pays it (money moved) after the harness moved the slot away from ADDR; prints
//     `OUTCOME <kind> <serverConfirmed>`.
// Any rejected call fails the run (exit 1).

import { AdmissionMinter, Checkout, Stockgate, reserveSplit } from '../../clients/node/src/index.js';

const [mode, ...rest] = process.argv.slice(2);

async function buy([seed, secretFile, skuList, seconds, partList]) {
  const skus = skuList.split(',');
  const minter = AdmissionMinter.fromFile(secretFile);
  const sg = new Stockgate({ cluster: seed });
  const until = Date.now() + Number(seconds) * 1000;
  for (let i = 0; Date.now() < until; i++) {
    const sku = skus[i % skus.length];
    const user = `u${i}`;
    const r = await sg.reserve(sku, user, minter.mint(sku, user), `r${i}`);
    if (r.kind !== 'reserved' && r.kind !== 'replay') throw new Error(`reserve ${sku}: ${r.kind}`);
    const committed = i % 2 === 0 && (await sg.commit(r.token)) === 'committed';
    console.log(`ACK ${r.token} ${committed ? 1 : 0}`);
  }
  const parts = partList.split(',');
  for (const p of parts) await sg.createSale(p, 2);
  let reserved = 0;
  for (let j = 0; j < 8; j++) {
    const r = await reserveSplit(sg, 'SPLIT', parts, `s${j}`, 1, {
      admission: (sku) => minter.mint(sku, `s${j}`),
      requestId: 'r',
    });
    if (r.outcome.kind === 'reserved') reserved++;
  }
  console.log(`SPLIT_RESERVED ${reserved}`);
  console.log(`RETRIED ${sg.retries}`);
  await sg.close();
  console.log('buyer ok');
}

async function hold([addr, secretFile, databaseUrl, sku, user]) {
  const sg = new Stockgate({ addr });
  const co = new Checkout({ stockgate: sg, databaseUrl });
  const admission = AdmissionMinter.fromFile(secretFile).mint(sku, user);
  const h = await co.reserveAndRecord({ sku, user, admission, requestId: `req-${user}` });
  if (!h.token) throw new Error(`no hold: ${JSON.stringify(h)}`);
  console.log(`TOKEN ${h.token}`);
  await co.close();
  await sg.close();
}

async function pay([how, addr, , databaseUrl, token]) {
  const sg = how === 'plain' ? new Stockgate({ addr }) : new Stockgate({ cluster: addr });
  const co = new Checkout({ stockgate: sg, databaseUrl });
  const out = await co.pay(token, `psp-${token.slice(-6)}`, { moneyMoved: true });
  console.log(`OUTCOME ${out.kind} ${out.serverConfirmed ?? '-'}`);
  await co.close();
  await sg.close();
}

const run = { buy, hold, pay }[mode];
if (!run) throw new Error(`unknown mode ${mode}`);
await run(rest);

// The shared checkout scenario (tests/scenario/checkout.json) through the Node package
// (clients/node: Stockgate + Checkout), printing its summary as one line `SUMMARY <json>`;
// tests/ledger/checkout_scenario.rs runs it beside the Rust and Python runners and compares the
// summaries. The steps are those of run_python.py (see there).
//
// Environment: STOCKGATE_ADDR, STOCKGATE_SECRET_FILE, STOCKGATE_DATABASE_URL,
// STOCKGATE_LEDGER_SCHEMA, SCENARIO_FILE, SCENARIO_SKU.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import { AdmissionMinter, Checkout, Hold, SoldOut, Stockgate } from '../../clients/node/src/index.js';

const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

const OUTCOME = {
  committed: 'committed',
  already_committed: 'already_committed',
  refused: 'refused',
  refund_required: 'refund_required',
};

async function main() {
  const spec = JSON.parse(readFileSync(process.env.SCENARIO_FILE, 'utf8'));
  const sku = process.env.SCENARIO_SKU;
  const url = process.env.STOCKGATE_DATABASE_URL;
  const schema = process.env.STOCKGATE_LEDGER_SCHEMA || 'stockgate';
  const minter = AdmissionMinter.fromFile(process.env.STOCKGATE_SECRET_FILE);
  const sg = new Stockgate({ addr: process.env.STOCKGATE_ADDR, connections: 32 });
  const co = new Checkout({ stockgate: sg, databaseUrl: url, schema, poolSize: 16 });
  const counts = {};
  const count = (name) => {
    counts[name] = (counts[name] ?? 0) + 1;
  };
  const countPay = (out) => {
    const name = OUTCOME[out.kind];
    assert.ok(name, `unexpected payment outcome ${JSON.stringify(out)}`);
    count(name);
  };
  try {
    await sg.createSale(sku, spec.total, { shards: spec.shards, ttlMs: spec.ttl_ms });

    const reserve = async (user, qty) => {
      for (;;) {
        const out = await co.reserveAndRecord({
          sku,
          user,
          admission: minter.mint(sku, user),
          requestId: `req-${user}`,
          qty,
        });
        if (!(out instanceof SoldOut) || (await sg.stock(sku)) === 0) return out;
      }
    };

    const buyers = spec.buyers;
    const holds = await Promise.all(buyers.map((b) => reserve(b.user, b.qty)));
    holds.forEach((h, i) => {
      assert.ok(h instanceof Hold, `${buyers[i].user}: ${JSON.stringify(h)}`);
      count('hold');
    });
    for (const user of spec.sold_out) {
      const out = await reserve(user, 1);
      assert.ok(out instanceof SoldOut, `${user}: ${JSON.stringify(out)}`);
      count('sold_out');
    }

    await Promise.all(
      buyers.map(async (b, i) => {
        const h = holds[i];
        if (b.action === 'pay') {
          countPay(await co.pay(h.token, `pay-${b.user}`, { moneyMoved: true }));
        } else if (b.action === 'pay_twice') {
          for (let n = 0; n < 2; n++) countPay(await co.pay(h.token, `pay-${b.user}`, { moneyMoved: true }));
        } else if (b.action === 'cancel') {
          if (await co.cancel(h.token)) count('cancelled');
        }
      }),
    );

    const deadline = Math.max(...holds.map((h) => h.expiresAtMs));
    while (Date.now() <= deadline + 20) await sleep(50);
    const late = buyers.map((b, i) => [b, holds[i]]).filter(([b]) => ['pay_late', 'authorize_late'].includes(b.action));
    const outs = await Promise.all(
      late.map(([b, h]) => co.pay(h.token, `late-${b.user}`, { moneyMoved: b.action === 'pay_late' })),
    );
    outs.forEach(countPay);

    const paid = buyers.filter((b) => ['pay', 'pay_twice'].includes(b.action)).reduce((s, b) => s + b.qty, 0);
    const t = Date.now();
    while ((await sg.saleInfo(sku)).available !== spec.total - paid) {
      assert.ok(Date.now() - t < 60000, 'the sweeper did not give the unpaid units back');
      await sleep(100);
    }
    const info = await sg.saleInfo(sku);
    // The checkout's own pool (the ledger's search_path is set on it).
    const rows = (
      await co.pool.query(
        `SELECT status, count(*)::int AS n, sum(qty)::int AS units FROM "${schema}".orders WHERE sku = $1 GROUP BY status`,
        [sku],
      )
    ).rows;
    const summary = {
      outcomes: counts,
      orders: Object.fromEntries(rows.map((r) => [r.status, [r.n, r.units]])),
      server: { committed: info.committed, reserved: info.reserved, available: info.available },
    };
    console.log(`SUMMARY ${JSON.stringify(summary)}`);
  } finally {
    await co.close();
    await sg.close();
  }
}

const timer = setTimeout(() => {
  console.error('the scenario did not finish within 120 s');
  process.exit(2);
}, 120000);
timer.unref();
main().catch((e) => {
  console.error(e);
  process.exit(1);
});

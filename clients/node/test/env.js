// The harness contract (/work/spec/ledger-functions.md, "The harness contract"): what the
// Rust harness (tests/clients/node_package.rs) gives the package's tests. A test whose environment
// is missing is skipped with the variable it needs named; the harness always gives it.

import pg from 'pg';

export const env = {
  addr: process.env.STOCKGATE_ADDR,
  secretFile: process.env.STOCKGATE_SECRET_FILE,
  databaseUrl: process.env.STOCKGATE_DATABASE_URL,
  schema: process.env.STOCKGATE_LEDGER_SCHEMA ?? 'stockgate',
  sweeperRunning: process.env.STOCKGATE_SWEEPER_RUNNING === '1',
  groupAddrs: process.env.STOCKGATE_GROUP_ADDRS,
  failoverSignal: process.env.STOCKGATE_FAILOVER_SIGNAL,
};

/** `false` when every named variable is set, else the reason to skip. */
export function needs(...names) {
  const missing = names.filter((n) => !process.env[n]);
  return missing.length === 0 ? false : `needs ${missing.join(', ')} (run by tests/clients/node_package.rs)`;
}

/** A run-unique suffix, so reruns against one server never meet an earlier sale. */
export const runId = `${Date.now().toString(36)}${process.pid.toString(36)}`;

export const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

/** Polls `f` until it returns a truthy value or `ms` pass (then throws `what`). */
export async function until(what, ms, f, every = 100) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error(`${what}: not within ${ms} ms`);
    await sleep(every);
  }
}

/**
 * A sale as an operator creates it (`stockgate-sweeper create-sale`): the ledger's row
 * first, then SALE.CREATE on the server.
 */
export async function createSale(sg, pool, schema, sku, total, { shards, ttlMs, limit = 0 }) {
  const info = await sg.call(['INFO', 'sales']);
  const fp = /key_fingerprint:(\w+)/.exec(String(info))?.[1] ?? null;
  await pool.query(
    `INSERT INTO "${schema}".sales (sku, initial_allocation, allocation, shards, ttl_ms, per_user_limit, key_fingerprint)
     VALUES ($1, $2, $2, $3, $4, $5, $6) ON CONFLICT (sku) DO NOTHING`,
    [sku, total, shards, ttlMs, limit, fp],
  );
  await sg.createSale(sku, total, { shards, ttlMs, limit });
}

export function pgPool(max = 4) {
  const p = new pg.Pool({ connectionString: env.databaseUrl, max });
  p.on('error', () => {});
  return p;
}

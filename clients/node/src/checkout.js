// The checkout flow over the ledger's functions (migrations/0006_ledger_functions.sql) and
// the server, in the order the Rust checkout (client/src/checkout.rs) and docs/ledger.md
// "The checkout steps, exactly" give:
//
//   reserveAndRecord: RESERVE, RESERVATION (the server's exact creation time identifies the
//                     hold later), materialize_order.
//   pay:              pay_order (the ledger's expiry guard and refund branch), then COMMIT on
//                     the server.
//   cancel:           cancel_order, then RELEASE token REASON cancel.
//
// Each ledger step is one statement; the functions take their row locks and write their
// audit rows themselves, so no rule lives here.

import pg from 'pg';

import { NoPerm, NoReservation, Released, StockgateError, Unavailable, ledgerErrorFrom } from './errors.js';

/** A reservation materialized in the ledger: the buyer may pay for it. */
export class Hold {
  constructor(f) {
    this.kind = 'hold';
    this.token = f.token;
    this.sku = f.sku;
    this.user = f.user;
    this.requestId = f.requestId;
    this.qty = f.qty;
    this.expiresAtMs = f.expiresAtMs;
    this.createdAtMs = f.createdAtMs;
    /** A retry of an earlier RESERVE (same request id): nothing new was taken. */
    this.replay = f.replay;
    /** Already paid (a retry after the payment). */
    this.alreadyCommitted = f.alreadyCommitted;
  }
}

/** Socket errors that mean "the connection failed", not "the statement failed". */
const SOCKET_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'ENOTCONN']);

/**
 * Whether a pg error means the statement's outcome is unknown because the connection
 * failed: SQLSTATE class 08 (connection exception), 57P01..03 (the server is shutting down
 * or restarting), a socket error, or pg's own "Connection terminated".
 * @param {any} e
 */
export function connectionLost(e) {
  const code = e && typeof e.code === 'string' ? e.code : '';
  if (code.startsWith('08') || code === '57P01' || code === '57P02' || code === '57P03') return true;
  if (SOCKET_CODES.has(code)) return true;
  return /^Connection terminated/.test(String(e?.message ?? ''));
}

function quoteIdent(s) {
  return `"${String(s).replace(/"/g, '""')}"`;
}

export class Checkout {
  /**
   * @param {object} opts see index.d.ts `CheckoutOptions`
   */
  constructor(opts) {
    const { stockgate, pool, databaseUrl, schema = 'stockgate', poolSize = 10 } = opts ?? {};
    if (!stockgate) throw new TypeError('Checkout needs `stockgate` (a Stockgate client)');
    if ((pool === undefined) === (databaseUrl === undefined)) {
      throw new TypeError('give exactly one of `pool` and `databaseUrl`');
    }
    this.sg = stockgate;
    this.schema = schema;
    this.ownPool = pool === undefined;
    // Functions are called schema-qualified; a pool made here also sets the search_path, as
    // the tools' connections do, so the ledger's tables resolve whatever the server default.
    this.pool =
      pool ??
      new pg.Pool({
        connectionString: databaseUrl,
        max: poolSize,
        options: `-c search_path=${quoteIdent(schema)}`,
      });
    if (this.ownPool) this.pool.on('error', () => {});
    this.fn = (name) => `${quoteIdent(schema)}.${name}`;
    /** Set once the server refused `COMMIT ... VERIFIED` to this connection's role. */
    this.plainCommitOnly = false;
  }

  /**
   * One ledger statement. After a lost connection its outcome is unknown, so it is sent
   * again on another connection (every ledger function is safe to repeat) with the
   * client's backoff, until the client's deadline (then `Unavailable`).
   */
  async #sql(text, values) {
    const deadline = Date.now() + this.sg.deadlineMs;
    for (let attempt = 1; ; attempt++) {
      try {
        const r = await this.pool.query(text, values);
        return r.rows;
      } catch (e) {
        if (!connectionLost(e)) throw ledgerErrorFrom(e) ?? e;
        const wait = Math.min(this.sg.backoffMinMs * 2 ** Math.min(attempt - 1, 16), this.sg.backoffMaxMs);
        if (Date.now() + wait > deadline) {
          throw new Unavailable('UNAVAILABLE', `ledger unreachable after ${attempt} attempts: ${e.message}`, {
            cause: e,
          });
        }
        await new Promise((ok) => setTimeout(ok, wait));
      }
    }
  }

  /**
   * Reserve on the server, read the reservation back, record the PENDING order
   * (`materialize_order`). Retry-safe: the same request id gives the same token and the
   * ledger step is idempotent. A `Hold`, or the server's SoldOut / Limit / Denied.
   * Rejects with `OrderRefused` when the ledger holds the token as cancelled (e.g.
   * tombstoned by the sweeper): do not take the payment.
   */
  async reserveAndRecord({ sku, user, admission, requestId, qty = 1 }) {
    // WITHLIMIT: a Limit names the per-user limit and what the user holds, as in Python.
    const r = await this.sg.reserve(sku, user, admission, requestId, { qty, withLimit: true });
    if (r.kind !== 'reserved' && r.kind !== 'replay') return r;
    const replay = r.kind === 'replay';
    let back;
    try {
      back = await this.sg.reservation(r.token);
    } catch (e) {
      // The hold exists; an approximate creation time only weakens the same-hold check to
      // the expiry, which is exact. A replay's qty and times must come from the server.
      if (replay || !(e instanceof Unavailable)) throw e;
      back = null;
    }
    const hold = {
      token: r.token,
      sku,
      user,
      requestId,
      qty: back ? back.qty : qty,
      expiresAtMs: back ? back.expiresAtMs : r.expiresAtMs,
      createdAtMs: back ? back.createdAtMs : Date.now(),
      replay,
      alreadyCommitted: false,
    };
    const [{ outcome }] = await this.#sql(
      `SELECT ${this.fn('materialize_order')}($1, $2, $3, $4, $5, $6, $7) AS outcome`,
      [hold.token, sku, user, requestId, hold.qty, hold.expiresAtMs, hold.createdAtMs],
    );
    hold.alreadyCommitted = outcome === 'ALREADY_COMMITTED';
    if (hold.alreadyCommitted && !replay) {
      // The server took stock again for a request that is already paid: it no longer knew
      // the paid hold (purged, or lost and rebuilt without it), so this new hold is not the
      // one the payment paid for. Its units go back now rather than when the sweeper comes.
      await this.sg.release(hold.token);
    }
    return new Hold(hold);
  }

  /**
   * A payment for `token`. `moneyMoved`: the provider already took the money (a capture
   * webhook, a one-step charge); false for authorize-then-capture, where a refusal means
   * "do not capture". Ledger first (`pay_order`: PENDING -> COMMITTED only while the hold
   * is unexpired, else refused or REFUND_REQUIRED), then COMMIT on the server.
   */
  async pay(token, paymentRef, { moneyMoved }) {
    if (typeof moneyMoved !== 'boolean') throw new TypeError('pay: moneyMoved must be a boolean');
    const [row] = await this.#sql(
      `SELECT outcome, previous_status FROM ${this.fn('pay_order')}($1, $2, $3)`,
      [token, paymentRef, moneyMoved],
    );
    const { outcome, previous_status: previous } = row;
    let fresh;
    switch (outcome) {
      case 'COMMITTED':
        fresh = true;
        break;
      case 'ALREADY_COMMITTED':
        fresh = false;
        break;
      case 'REFUSED':
        return { kind: 'refused', status: previous };
      case 'LIMIT':
        // A part of a split sale, and the buyer's paid units of the whole parent would go
        // over its per-user limit: nothing changed, the hold is the caller's to release.
        return { kind: 'over_limit' };
      case 'REFUND_REQUIRED':
        return { kind: 'refund_required', previous };
      case 'NOT_FOUND':
        // No order to attach a refund to: the caller must handle the money itself.
        return { kind: 'refused', status: null };
      default:
        throw new TypeError(`pay_order answered an unknown outcome ${JSON.stringify(outcome)}`);
    }
    if (!fresh && !(await this.#serverHoldsThisPayment(token))) {
      // A retry of a payment the ledger already has, and the server's hold for this token
      // (if any) is not the one it paid for: committing it would sell a unit twice.
      return { kind: 'already_committed' };
    }
    let answer;
    try {
      answer = await this.#commitOnServer(token);
    } catch (e) {
      if (e instanceof Released) {
        // The units went back to stock and may be sold again: this sale cannot stand.
        const prev = await this.#markRefundRequired(token, paymentRef, 'server released the units');
        return { kind: 'refund_required', previous: prev };
      }
      if (e instanceof NoReservation) {
        if (!fresh) return { kind: 'already_committed' };
        // The server does not hold it (lost and rebuilt without it): its units were counted
        // as available again.
        const prev = await this.#markRefundRequired(
          token,
          paymentRef,
          'server has no such reservation',
        );
        return { kind: 'refund_required', previous: prev };
      }
      // Accepted in time by the ledger, but the server cannot be told now (unreachable,
      // fenced, past the deadline on a role that may not say VERIFIED, the sale moved to
      // another group, or any other refusal): the payment stands, and the sweeper's cleanup
      // of paid orders commits it. Money moved and the ledger committed: never a throw.
      if (e instanceof StockgateError) {
        return fresh ? { kind: 'committed', serverConfirmed: false } : { kind: 'already_committed' };
      }
      throw e;
    }
    if (answer === 'committed' && fresh) return { kind: 'committed', serverConfirmed: true };
    return { kind: 'already_committed' };
  }

  /**
   * COMMIT after the ledger committed the payment under its expiry guard: the payment was in
   * time even if this arrives after the hold's deadline, so it is sent VERIFIED. A role that
   * may not say so (`checkout`) gets -NOPERM once; from then on the plain form is sent.
   */
  async #commitOnServer(token) {
    if (!this.plainCommitOnly) {
      try {
        return await this.sg.commit(token, { verified: true });
      } catch (e) {
        if (!(e instanceof NoPerm)) throw e;
        this.plainCommitOnly = true;
      }
    }
    return this.sg.commit(token);
  }

  /**
   * For a payment already committed in the ledger: whether the server's reservation for the
   * token is the hold that payment paid for (`order_is_hold`). A RESERVED hold that is not
   * is released (nobody paid for it).
   */
  async #serverHoldsThisPayment(token) {
    let r;
    try {
      r = await this.sg.reservation(token);
    } catch (e) {
      // The ledger has the payment; a server that cannot say now (moved, unreachable)
      // leaves the hold to the sweeper rather than failing a paid order.
      if (e instanceof StockgateError) return false;
      throw e;
    }
    if (r === null) return false;
    const [{ same }] = await this.#sql(
      `SELECT ${this.fn('order_is_hold')}($1, $2, $3, $4, $5, $6) AS same`,
      [token, r.sku, r.user, r.qty, r.createdAtMs, r.expiresAtMs],
    );
    if (same) return true;
    if (r.state === 'RESERVED') await this.sg.release(token);
    return false;
  }

  async #markRefundRequired(token, paymentRef, reason) {
    const [{ previous }] = await this.#sql(
      `SELECT ${this.fn('mark_refund_required')}($1, $2, $3) AS previous`,
      [token, paymentRef, reason],
    );
    return previous;
  }

  /**
   * The buyer abandons: `cancel_order` (PENDING -> CANCELLED), then
   * `RELEASE token REASON cancel`, so the units are back at once (if this dies in between,
   * the sweeper releases the CANCELLED order's hold when it expires). Resolves to whether
   * this call returned the units. Rejects with `OrderRefused` for a paid order.
   */
  async cancel(token) {
    await this.#sql(`SELECT ${this.fn('cancel_order')}($1) AS outcome`, [token]);
    return this.sg.release(token, { reason: 'cancel' });
  }

  /**
   * Extends the hold: server first (it refuses expired holds), then the ledger
   * (`extend_order`). If the ledger step fails, the ledger keeps the earlier, stricter
   * deadline. Resolves to the new expires_at_ms.
   */
  async extend(token, ms) {
    const at = await this.sg.extend(token, ms);
    await this.#sql(`SELECT ${this.fn('extend_order')}($1, $2) AS outcome`, [token, at]);
    return at;
  }

  /** After the refund went through: REFUND_REQUIRED -> REFUNDED ('REFUNDED' / 'ALREADY_REFUNDED'). */
  async markRefunded(token) {
    const [{ outcome }] = await this.#sql(`SELECT ${this.fn('mark_refunded')}($1) AS outcome`, [token]);
    return outcome;
  }

  /** Closes the Postgres pool if this object made it (not the Stockgate client). */
  async close() {
    if (this.ownPool) await this.pool.end();
  }
}

// Errors: one base class, `StockgateError`, whose `code` is the server's error code (the
// first word of its reply, docs/protocol.md section 10), the ledger's SQLSTATE (SG001..SG004)
// or this package's own (`UNAVAILABLE`). Applications match on the class or on `code`; the
// message is for people.

export class StockgateError extends Error {
  /**
   * @param {string} code
   * @param {string} message
   * @param {{ cause?: unknown, detail?: string }} [opts]
   */
  constructor(code, message, opts = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = new.target.name;
    this.code = code;
    // The server's message after the code (for people; it may gain words).
    this.detail = opts.detail ?? message;
  }
}

// --- Server reply errors (docs/protocol.md section 10) ---------------------------------

/** `ERR`: a refused request (arguments, capacity, state); nothing changed. */
export class CommandError extends StockgateError {}
/** `NOSALE`: unknown sku. */
export class NoSale extends StockgateError {}
/** `FENCED`: the sale's state is unproven until the operator's rebuild. */
export class Fenced extends StockgateError {}
/** `PAUSED`: RESERVE on a paused sale; retry later with the same request id. */
export class Paused extends StockgateError {}
/**
 * `DENIED`: an admission token refused. `reserve` answers it as a `Denied` result; this class
 * is what a raw `call` of RESERVE raises.
 */
export class AdmissionDenied extends StockgateError {
  constructor(code, message, opts) {
    super(code, message, opts);
    this.reason = deniedReason(this.detail);
  }
}
/** `EXISTS`: SALE.CREATE with other parameters. */
export class Exists extends StockgateError {}
/** `NORES`: EXTEND or COMMIT of an unknown token (or EXTEND of one no longer RESERVED). */
export class NoReservation extends StockgateError {}
/** `EXPIRED`: EXTEND past the deadline, COMMIT past it without VERIFIED. */
export class Expired extends StockgateError {
  constructor(code, message, opts) {
    super(code, message, opts);
    const m = /expired at (\d+) ms/.exec(this.detail);
    /** The hold's deadline when the server names it (COMMIT), else null. */
    this.expiresAtMs = m ? Number(m[1]) : null;
  }
}
/** `RELEASED`: COMMIT of a reservation whose units went back to stock. */
export class Released extends StockgateError {}
/** `NOAUTH`: authentication required. */
export class NoAuth extends StockgateError {}
/** `WRONGPASS`: bad user or password. */
export class WrongPass extends StockgateError {}
/** `NOPERM`: a command (or `COMMIT ... VERIFIED`) outside the connection's role. */
export class NoPerm extends StockgateError {}
/** `NOPROTO`: HELLO with an unsupported version. */
export class NoProto extends StockgateError {}
/** `EXECABORT`: EXEC after a queue-time refusal. */
export class ExecAbort extends StockgateError {}
/** `READONLY`: a write on a member that is not the writable leader (it did not run). */
export class ReadOnly extends StockgateError {}
/** `LOADING`: a write on a leader still catching up (it did not run). */
export class Loading extends StockgateError {}
/** `NOREPLICAS`: refused for want of replicas (it did not run). */
export class NoReplicas extends StockgateError {}
/** `NOQUORUM`: `SENTINEL ckquorum` with no leader known. */
export class NoQuorum extends StockgateError {}
/** `NOGOODSLAVE`: `SENTINEL failover` with no candidate. */
export class NoGoodSlave extends StockgateError {}
/** `NOGROUP`: unknown consumer group. */
export class NoGroup extends StockgateError {}
/** `BUSYGROUP`: the consumer group exists. */
export class BusyGroup extends StockgateError {}
/** `MOVED <slot> <host>:<port>`: cluster mode, the sale's slot is another group's (it did not run). */
export class Moved extends StockgateError {}
/** `ASK <slot> <host>:<port>`: cluster mode, the slot is moving and the sale is on the destination (it did not run). */
export class Ask extends StockgateError {}
/** `TRYAGAIN`: the sale is frozen while it moves to another group (it did not run; retried until the deadline). */
export class TryAgain extends StockgateError {}
/** `CROSSSLOT`: a transaction touched two slots (nothing ran). */
export class CrossSlot extends StockgateError {}
/** `CLUSTERDOWN`: the slot has no owner in the cluster map (it did not run). */
export class ClusterDown extends StockgateError {}

// --- The waiting room's refusals (docs/protocol.md section 4a) -------------------------

/** `QUEUEFULL` (ROOM.JOIN): the room holds its `MAX` buyers already; nothing changed. */
export class QueueFull extends StockgateError {
  constructor(code, message, opts) {
    super(code, message, opts);
    const m = /queue full: (\d+) buyers/.exec(this.detail);
    /** The room's limit when the server names it, else null. */
    this.maxWaiting = m ? Number(m[1]) : null;
  }
}
/**
 * `SOLDOUT` (ROOM.JOIN): nothing available and nothing held, so the room takes no new
 * buyers. (`reserve` answers a `SoldOut` result instead.)
 */
export class SoldOutError extends StockgateError {}
/** `TOOMANYJOINS` (ROOM.JOIN): the user took the most places one user may take (4). */
export class TooManyJoins extends StockgateError {}
/** `NOROOM`: the sale has no waiting room (`openRoom` opens one). */
export class NoRoom extends StockgateError {}
/**
 * `BADTICKET` (ROOM.STATUS): a malformed or altered ticket, one of another sale or user, or
 * (`stale`) one of a place given up since: a later join replaced it.
 */
export class BadTicket extends StockgateError {
  constructor(code, message, opts) {
    super(code, message, opts);
    this.stale = this.detail.startsWith('stale ticket');
  }
}
/** `NOTQUEUED` (ROOM.STATUS): the user holds no place in the room. */
export class NotQueued extends StockgateError {}

/**
 * `UNAVAILABLE` (this package's): a call that may be retried kept failing (connection lost,
 * no leader, refused as READONLY/LOADING) until its deadline. `cause` is the last failure.
 */
export class Unavailable extends StockgateError {}

// --- Ledger errors (SQLSTATEs of the ledger functions) ---------------------------------

/** Any error a ledger function raised with one of its SQLSTATEs. */
export class LedgerError extends StockgateError {}
/** `SG001`: the order's status does not allow this step. `status` is the order's status. */
export class OrderRefused extends LedgerError {
  constructor(code, message, opts) {
    super(code, message, opts);
    const m = /^order (\S+) is ([A-Z_]+)/.exec(this.detail);
    this.token = m ? m[1] : null;
    this.status = m ? m[2] : null;
  }
}
/** `SG002`: the token exists with another sku / user / qty (a bug in the caller). */
export class OrderConflict extends LedgerError {}
/** `SG003`: no order for this token. */
export class OrderNotFound extends LedgerError {}
/** `SG004`: an invalid argument (qty <= 0, empty token, negative time, ...). */
export class LedgerInvalidArgument extends LedgerError {}

const BY_CODE = {
  ERR: CommandError,
  NOSALE: NoSale,
  FENCED: Fenced,
  PAUSED: Paused,
  DENIED: AdmissionDenied,
  EXISTS: Exists,
  NORES: NoReservation,
  EXPIRED: Expired,
  RELEASED: Released,
  NOAUTH: NoAuth,
  WRONGPASS: WrongPass,
  NOPERM: NoPerm,
  NOPROTO: NoProto,
  EXECABORT: ExecAbort,
  READONLY: ReadOnly,
  LOADING: Loading,
  NOREPLICAS: NoReplicas,
  NOQUORUM: NoQuorum,
  NOGOODSLAVE: NoGoodSlave,
  NOGROUP: NoGroup,
  BUSYGROUP: BusyGroup,
  MOVED: Moved,
  ASK: Ask,
  TRYAGAIN: TryAgain,
  CROSSSLOT: CrossSlot,
  CLUSTERDOWN: ClusterDown,
  QUEUEFULL: QueueFull,
  SOLDOUT: SoldOutError,
  TOOMANYJOINS: TooManyJoins,
  NOROOM: NoRoom,
  BADTICKET: BadTicket,
  NOTQUEUED: NotQueued,
};

const BY_SQLSTATE = {
  SG001: OrderRefused,
  SG002: OrderConflict,
  SG003: OrderNotFound,
  SG004: LedgerInvalidArgument,
};

/**
 * The typed error for a server error reply's text (`CODE message`, without the `-`).
 * @param {string} text
 * @param {unknown} [cause]
 * @returns {StockgateError}
 */
export function errorFromReply(text, cause) {
  const s = String(text);
  const sp = s.indexOf(' ');
  const code = sp < 0 ? s : s.slice(0, sp);
  const detail = sp < 0 ? '' : s.slice(sp + 1);
  const Cls = BY_CODE[code] ?? StockgateError;
  return new Cls(code, s, { cause, detail });
}

/**
 * The typed error for a Postgres error raised by a ledger function, or null when it is not
 * one of the ledger's SQLSTATEs.
 * @param {any} err
 * @returns {LedgerError | null}
 */
export function ledgerErrorFrom(err) {
  const code = err && typeof err.code === 'string' ? err.code : '';
  const Cls = BY_SQLSTATE[code];
  if (!Cls) return null;
  const msg = String(err.message ?? code);
  return new Cls(code, msg, { cause: err, detail: msg });
}

const DENIED_REASONS = {
  'malformed admission token': 'malformed',
  'unknown key id': 'unknown_key',
  'bad signature': 'bad_signature',
  'token bound to another sku': 'wrong_sku',
  'token bound to another user': 'wrong_user',
  expired: 'expired',
};

/**
 * The reason name (as INFO and Prometheus name it) of a `-DENIED` reply's text after the code.
 * @param {string} detail
 * @returns {string}
 */
export function deniedReason(detail) {
  const d = String(detail).trim();
  for (const [text, reason] of Object.entries(DENIED_REASONS)) {
    if (d === text || d.startsWith(`${text} `)) return reason;
  }
  return 'unknown';
}

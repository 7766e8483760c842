// Types of the `stockgate` package (ESM). Replies and errors: docs/protocol.md; the ledger
// functions: migrations/0006_ledger_functions.sql.

import type { Pool } from 'pg';
import type { RedisOptions } from 'ioredis';

// ---------------------------------------------------------------------------------------
// RESERVE results (a discriminated union on `kind`)

/** RESERVED: a new reservation; `qty` units taken until `expiresAtMs`. */
export declare class Reserved {
  readonly kind: 'reserved';
  readonly token: string;
  readonly expiresAtMs: number;
  readonly shard: number;
  constructor(token: string, expiresAtMs: number, shard: number);
}

/** REPLAY: this (sku, user, request id) was seen before; nothing taken. */
export declare class Replay {
  readonly kind: 'replay';
  readonly token: string;
  readonly expiresAtMs: number;
  readonly shard: number;
  constructor(token: string, expiresAtMs: number, shard: number);
}

/** SOLDOUT: no shard probed had the units (not remembered: a retry may succeed). */
export declare class SoldOut {
  readonly kind: 'soldout';
}

/**
 * LIMIT: the per-user limit. `liveTokens`: the user's reservations still RESERVED. `limit`
 * and `held` are the sale's units per user and the user's units RESERVED or COMMITTED, given
 * with `withLimit` (null otherwise).
 */
export declare class Limit {
  readonly kind: 'limit';
  readonly liveTokens: string[];
  readonly limit: number | null;
  readonly held: number | null;
  constructor(liveTokens: string[], limit: number | null, held: number | null);
}

/** The admission-token refusals, as INFO and Prometheus name them. */
export type DeniedReason =
  | 'malformed'
  | 'unknown_key'
  | 'bad_signature'
  | 'wrong_sku'
  | 'wrong_user'
  | 'expired'
  | 'unknown';

/** `-DENIED <why>`: the admission token was refused. */
export declare class Denied {
  readonly kind: 'denied';
  readonly reason: DeniedReason;
  /** The server's text, e.g. `DENIED token bound to another user`. */
  readonly message: string;
  constructor(reason: DeniedReason, message: string);
}

export type ReserveResult = Reserved | Replay | SoldOut | Limit | Denied;

// ---------------------------------------------------------------------------------------
// RESERVATION, SALE.INFO (discriminated unions on `state`)

interface ReservationFields {
  readonly token: string;
  readonly sku: string;
  readonly user: string;
  readonly requestId: string;
  readonly qty: number;
  readonly shard: number;
  readonly expiresAtMs: number;
  readonly createdAtMs: number;
}
export interface ReservedReservation extends ReservationFields {
  readonly state: 'RESERVED';
}
export interface CommittedReservation extends ReservationFields {
  readonly state: 'COMMITTED';
}
export interface ReleasedReservation extends ReservationFields {
  readonly state: 'RELEASED';
}
/** The RESERVATION reply. */
export type Reservation = ReservedReservation | CommittedReservation | ReleasedReservation;
export type ReservationState = Reservation['state'];

interface SaleInfoFields {
  readonly total: number;
  readonly available: number;
  readonly reserved: number;
  readonly committed: number;
  readonly shards: number;
  readonly ttlMs: number;
  /** Units per user; 0 is no limit. */
  readonly limit: number;
  readonly keyFingerprint: string;
  readonly shardAvailable: number[];
}
export interface OpenSale extends SaleInfoFields {
  readonly state: 'OPEN';
}
export interface PausedSale extends SaleInfoFields {
  readonly state: 'PAUSED';
}
export interface FencedSale extends SaleInfoFields {
  readonly state: 'FENCED';
}
/** Frozen while it moves to another group: its writes answer TRYAGAIN (retried). */
export interface MovingSale extends SaleInfoFields {
  readonly state: 'MOVING';
}
/** The SALE.INFO reply. */
export type SaleInfo = OpenSale | PausedSale | FencedSale | MovingSale;
export type SaleState = SaleInfo['state'];

/** COMMIT: `:1` committed by this call, `:0` already committed. */
export type CommitResult = 'committed' | 'already_committed';
export type ReleaseReason = 'cancel' | 'expired' | 'admin' | 'rebuild';

// ---------------------------------------------------------------------------------------
// The waiting room (docs/protocol.md section 4a)

/** ROOM.JOIN: the user's place; the same ticket again while the user holds one. */
export interface RoomTicket {
  readonly ticket: string;
  /** 1-based while waiting; 0 when admitted already or before the sale opens (`status` says which). */
  readonly position: number;
  /** The estimated wait, from the recent admission rate. */
  readonly etaMs: number;
}

/** In line. */
export interface RoomWaiting {
  readonly kind: 'waiting';
  /** 1-based. */
  readonly position: number;
  readonly etaMs: number;
}
/** The buyer's turn: pass `admission` to `reserve` before `untilMs`. */
export interface RoomAdmitted {
  readonly kind: 'admitted';
  /** The admission token RESERVE verifies, minted for (sku, user, untilMs). */
  readonly admission: string;
  readonly untilMs: number;
}
/** Pre-queued: the line is drawn in a random order when the sale opens. */
export interface RoomBeforeOpen {
  readonly kind: 'before_open';
  readonly opensAtMs: number;
}
/** The admission was used by a RESERVE. */
export interface RoomReserved {
  readonly kind: 'reserved';
}
/** Nothing available and nothing held. */
export interface RoomSoldOut {
  readonly kind: 'soldout';
}
/** Admitted, not reserved within ADMIT-TTL: join again for a place at the back. */
export interface RoomExpired {
  readonly kind: 'expired';
}
/** The place was given up (ROOM.LEAVE). */
export interface RoomLeft {
  readonly kind: 'left';
}
/** ROOM.STATUS (a discriminated union on `kind`). */
export type RoomStatus =
  | RoomWaiting
  | RoomAdmitted
  | RoomBeforeOpen
  | RoomReserved
  | RoomSoldOut
  | RoomExpired
  | RoomLeft;
export type RoomStatusKind = RoomStatus['kind'];

/** ROOM.INFO: the room's settings, then its counts. */
export interface RoomInfo {
  readonly opensAtMs: number;
  /** Admissions per second at most. */
  readonly rate: number;
  readonly overadmitPermille: number;
  readonly admitTtlMs: number;
  readonly windowMs: number;
  readonly maxWaiting: number;
  /** Buyers in line or pre-queued. */
  readonly waiting: number;
  /** Admitted, not reserved yet. */
  readonly admitted: number;
  /** The line is drawn (the sale opened and the room moved since). */
  readonly open: boolean;
  /** Waiting buyers are told SOLDOUT; joins are refused. */
  readonly soldOut: boolean;
}

/** ROOM.OPEN's settings (admin); one left out is the server's default. */
export interface RoomOptions {
  /** ms since the epoch; joins before it are pre-queued (default 0: open). */
  opensAtMs?: number;
  /** Admissions per second, 1-1,000,000 (default 100). */
  rate?: number;
  /** Admitted-but-not-reserved buyers per unit available, per mille, 100-10,000 (default 1000). */
  overadmitPermille?: number;
  /** How long an admission lasts, 1-3,600,000 ms (default 120,000). */
  admitTtlMs?: number;
  /** 0-3,600,000 ms (default 10,000). */
  windowMs?: number;
  /** Buyers waiting at most, 1-50,000,000 (default 1,000,000). */
  maxWaiting?: number;
}

// ---------------------------------------------------------------------------------------
// Live counts over RESP (docs/protocol.md section 4a, "Live counts over RESP")

/** On a buyer's channel: the buyer's turn until `untilMs` (the admission token comes from `status`). */
export interface PlaceAdmitted {
  readonly kind: 'admitted';
  readonly untilMs: number;
}
/** On a buyer's channel: the room (or the place) is gone, the sale dropped or moved away. */
export interface PlaceGone {
  readonly kind: 'gone';
}
/** A buyer's place as its channel tells it (a discriminated union on `kind`). */
export type PlaceStatus =
  | RoomWaiting
  | PlaceAdmitted
  | RoomBeforeOpen
  | RoomReserved
  | RoomSoldOut
  | RoomExpired
  | RoomLeft
  | PlaceGone;

/** One live channel message. */
export interface LiveCounts {
  readonly sku: string;
  /** SALE.INFO's `available`. */
  readonly available: number;
  /** Units in live holds (SALE.INFO's `reserved`). */
  readonly held: number;
  /** Committed units (SALE.INFO's `committed`). */
  readonly sold: number;
  /** Buyers in line or pre-queued (0 without a room). */
  readonly waiting: number;
  /** Admitted, not reserved yet (0 without a room). */
  readonly admitted: number;
  /** Whether the sale has a waiting room. */
  readonly room: boolean;
  /** SALE.INFO's state, or `GONE` once the sale is dropped or moved away. */
  readonly state: SaleState | 'GONE';
  /** The buyer's place: on a buyer's channel (`watchPlace`) only. */
  readonly you?: PlaceStatus;
}

export interface WatchOptions {
  /** Connection errors (ioredis reconnects and subscribes again) and payloads of another shape. Default: the client's `onError`. */
  onError?: (err: Error) => void;
}

/** A live channel's subscription, on a connection of its own. */
export declare class LiveWatch {
  /** `sale:<sku>:live` or `place:<ticket>`. */
  readonly channel: string;
  readonly closed: boolean;
  /** Closes the watch's connection (the server frees its watcher). */
  close(): Promise<void>;
}

// ---------------------------------------------------------------------------------------
// Errors

/** Every error of this package: `code` is the server's error code (first word of its reply),
 * the ledger's SQLSTATE, or this package's (`UNAVAILABLE`, `OUTCOME_UNKNOWN`, `PROTOCOL`). */
export declare class StockgateError extends Error {
  readonly code: string;
  /** The server's message after the code. */
  readonly detail: string;
  constructor(code: string, message: string, opts?: { cause?: unknown; detail?: string });
}
/** `ERR`: a refused request (arguments, capacity, state). */
export declare class CommandError extends StockgateError {}
/** `NOSALE`: unknown sku. */
export declare class NoSale extends StockgateError {}
/** `FENCED`: the sale's state is unproven until the operator's rebuild. */
export declare class Fenced extends StockgateError {}
/** `PAUSED`: RESERVE on a paused sale. */
export declare class Paused extends StockgateError {}
/** `DENIED` from a raw `call` (`reserve` answers a `Denied` result instead). */
export declare class AdmissionDenied extends StockgateError {
  readonly reason: DeniedReason;
}
/** `EXISTS`: SALE.CREATE with other parameters. */
export declare class Exists extends StockgateError {}
/** `NORES`: EXTEND or COMMIT of an unknown token; EXTEND of one no longer RESERVED. */
export declare class NoReservation extends StockgateError {}
/** `EXPIRED`: EXTEND past the deadline; COMMIT past it without VERIFIED. */
export declare class Expired extends StockgateError {
  /** The hold's deadline when the server names it (COMMIT), else null. */
  readonly expiresAtMs: number | null;
}
/** `RELEASED`: COMMIT of a reservation whose units went back to stock. */
export declare class Released extends StockgateError {}
export declare class NoAuth extends StockgateError {}
export declare class WrongPass extends StockgateError {}
/** `NOPERM`: a command (or `COMMIT ... VERIFIED`) outside the connection's role. */
export declare class NoPerm extends StockgateError {}
export declare class NoProto extends StockgateError {}
export declare class ExecAbort extends StockgateError {}
/** `READONLY` (retried by the client until its deadline). */
export declare class ReadOnly extends StockgateError {}
/** `LOADING` (retried by the client until its deadline). */
export declare class Loading extends StockgateError {}
/** `NOREPLICAS` (retried by the client until its deadline). */
export declare class NoReplicas extends StockgateError {}
export declare class NoQuorum extends StockgateError {}
export declare class NoGoodSlave extends StockgateError {}
export declare class NoGroup extends StockgateError {}
export declare class BusyGroup extends StockgateError {}
/** `MOVED <slot> <host>:<port>`: cluster mode, the slot is another group's (it did not run). */
export declare class Moved extends StockgateError {}
/** `ASK <slot> <host>:<port>`: cluster mode, the slot is moving (it did not run). */
export declare class Ask extends StockgateError {}
/** `TRYAGAIN` (retried by the client until its deadline): the sale is frozen for a move. */
export declare class TryAgain extends StockgateError {}
/** `CROSSSLOT`: a transaction touched two slots (nothing ran). */
export declare class CrossSlot extends StockgateError {}
/** `CLUSTERDOWN`: the slot has no owner in the cluster map (it did not run). */
export declare class ClusterDown extends StockgateError {}
/** `QUEUEFULL` (ROOM.JOIN): the room holds its `MAX` buyers already. */
export declare class QueueFull extends StockgateError {
  /** The room's limit when the server names it, else null. */
  readonly maxWaiting: number | null;
}
/** `SOLDOUT` (ROOM.JOIN): nothing available and nothing held; no new buyers. */
export declare class SoldOutError extends StockgateError {}
/** `TOOMANYJOINS` (ROOM.JOIN): the most places one user may take in a sale (4). */
export declare class TooManyJoins extends StockgateError {}
/** `NOROOM`: the sale has no waiting room. */
export declare class NoRoom extends StockgateError {}
/** `BADTICKET` (ROOM.STATUS): forged, altered, of another sale or user, or `stale` (replaced by a later join). */
export declare class BadTicket extends StockgateError {
  readonly stale: boolean;
}
/** `NOTQUEUED` (ROOM.STATUS): the user holds no place in the room. */
export declare class NotQueued extends StockgateError {}
/** `UNAVAILABLE`: a retriable call kept failing until its deadline; `cause` the last failure. */
export declare class Unavailable extends StockgateError {}
/** `OUTCOME_UNKNOWN`: a raw non-idempotent call lost its reply; it may or may not have run. */
export declare class OutcomeUnknown extends StockgateError {}
/** `PROTOCOL`: a reply without the documented shape. */
export declare class ProtocolMismatch extends StockgateError {
  constructor(message: string);
}

/** Errors raised by the ledger functions (`code` is the SQLSTATE). */
export declare class LedgerError extends StockgateError {}
/** `SG001`: the order's status does not allow this step. */
export declare class OrderRefused extends LedgerError {
  readonly token: string | null;
  readonly status: OrderStatus | null;
}
/** `SG002`: the token exists with another sku / user / qty. */
export declare class OrderConflict extends LedgerError {}
/** `SG003`: no order for this token. */
export declare class OrderNotFound extends LedgerError {}
/** `SG004`: an invalid argument. */
export declare class LedgerInvalidArgument extends LedgerError {}

/** The typed error for a server error reply's text (`CODE message`). */
export declare function errorFromReply(text: string, cause?: unknown): StockgateError;
/** The typed error for a Postgres error of a ledger function, or null. */
export declare function ledgerErrorFrom(err: unknown): LedgerError | null;
/** The reason name of a `-DENIED` reply's text after the code. */
export declare function deniedReason(detail: string): DeniedReason;

// ---------------------------------------------------------------------------------------
// Reply parsers (the client uses them; exported for other RESP clients)

export declare function parseReserve(reply: unknown): Reserved | Replay | SoldOut | Limit;
export declare function parseReservation(reply: unknown): Reservation | null;
export declare function parseSaleInfo(reply: unknown): SaleInfo;
export declare function parseCommit(reply: unknown): CommitResult;
export declare function parseRelease(reply: unknown): boolean;
export declare function parseRoomJoin(reply: unknown): RoomTicket;
export declare function parseRoomStatus(reply: unknown): RoomStatus;
export declare function parseRoomLeave(reply: unknown): boolean;
export declare function parseRoomInfo(reply: unknown): RoomInfo;
/** A live channel message's JSON payload. */
export declare function parseLive(payload: string | Buffer): LiveCounts;
/** A buyer channel's `you` object. */
export declare function parsePlace(you: unknown): PlaceStatus;

// ---------------------------------------------------------------------------------------
// Admission tokens

export interface AdmissionKey {
  readonly kid: string;
  readonly secret: Buffer;
}
/** A secret file that does not parse as the server parses it. */
export declare class SecretFileError extends Error {}
/** Parses a secret file's text (`<kid> <hex>` lines, `#` comments); the first key signs. */
export declare function parseSecretFile(text: string): AdmissionKey[];
/** `base64url(payload) "." base64url(HMAC-SHA256(secret, payload))`, payload `v1|kid|sku|user|exp`. */
export declare function mintAdmissionToken(
  secret: Uint8Array,
  kid: string,
  sku: string,
  user: string,
  expiresAtMs: number | bigint,
): string;
export declare function isValidSku(s: unknown): boolean;
export declare function isValidUser(s: unknown): boolean;

export declare class AdmissionMinter {
  constructor(keys: AdmissionKey[], opts?: { ttlMs?: number });
  /** A minter over a secret file's keys. */
  static fromFile(path: string, opts?: { ttlMs?: number }): AdmissionMinter;
  readonly keys: AdmissionKey[];
  readonly kid: string;
  /** Default token lifetime (60 s). */
  ttlMs: number;
  mint(sku: string, user: string, opts?: { ttlMs?: number; expiresAtMs?: number }): string;
}

// ---------------------------------------------------------------------------------------
// The client

export type HostPort = string | { host: string; port: number };

interface CommonOptions {
  /**
   * Credentials (AUTH) when the server has users; also sent to the sentinels. A
   * `redis://user:password@host:port` address gives them too (they must agree).
   */
  username?: string;
  password?: string;
  /** Connections opened (calls go round-robin to a ready one). Default 1. */
  connections?: number;
  /** How long a call keeps retrying before `Unavailable`. Default 30,000 ms. */
  deadlineMs?: number;
  /** A reply not received within this is taken as lost (and the call resent). Default 5,000 ms. */
  commandTimeoutMs?: number;
  /** Backoff between attempts, doubling from min to max. Defaults 50 and 500 ms. */
  backoffMinMs?: number;
  backoffMaxMs?: number;
  /** More ioredis options (they override this package's). */
  redisOptions?: RedisOptions;
  /** Every connection error ioredis reports (they are retried; for logs). */
  onError?: (err: Error) => void;
}
export interface AddrOptions extends CommonOptions {
  /** One server, `host:port`, or `rediss://host:port` for TLS. */
  addr: HostPort;
  /**
   * TLS to the server (its --tls-port): `ca` verifies it, `cert`/`key` are this client's
   * certificate for a server that requires one (PEM strings or Buffers; any other
   * `tls.connect` option passes through). `true`: the system's roots.
   */
  tls?: boolean | { ca?: string | Buffer; cert?: string | Buffer; key?: string | Buffer; [opt: string]: unknown };
  sentinels?: undefined;
  cluster?: undefined;
}
export interface SentinelOptions extends CommonOptions {
  /** The group's members (or Sentinels): `host:port` list, array or comma-separated. */
  sentinels: HostPort[] | string;
  /** The master name: the group's `--group-name`, default `stockgate`. */
  name?: string;
  addr?: undefined;
  cluster?: undefined;
}
export interface ClusterOptions extends CommonOptions {
  /**
   * Groups in cluster mode (docs/cluster.md): one or more seed nodes, array or
   * comma-separated. The slot map comes from CLUSTER SLOTS; every command goes to the group
   * owning its sku's slot; -MOVED and -ASK are followed, and -TRYAGAIN retried, until
   * the call's deadline.
   */
  cluster: HostPort[] | string;
  tls?: boolean | { ca?: string | Buffer; cert?: string | Buffer; key?: string | Buffer; [opt: string]: unknown };
  addr?: undefined;
  sentinels?: undefined;
}
export type StockgateOptions = AddrOptions | SentinelOptions | ClusterOptions;

export interface ReserveOptions {
  /** 1-1,000,000 units (default 1). */
  qty?: number;
  /** LIMIT replies carry `limit` and `held`. */
  withLimit?: boolean;
}

export declare class Stockgate {
  constructor(opts: StockgateOptions);
  /** Commands sent again after a lost reply or a refusal. */
  readonly retries: number;
  /** Where the client points (for messages). */
  readonly target: string;
  /** Waits until every connection answers PING. */
  ready(): Promise<void>;
  reserve(
    sku: string,
    user: string,
    admission: string,
    requestId: string,
    opts?: ReserveOptions,
  ): Promise<ReserveResult>;
  commit(token: string, opts?: { verified?: boolean }): Promise<CommitResult>;
  release(token: string, opts?: { reason?: ReleaseReason }): Promise<boolean>;
  extend(token: string, ms: number): Promise<number>;
  reservation(token: string): Promise<Reservation | null>;
  stock(sku: string): Promise<number>;
  saleInfo(sku: string): Promise<SaleInfo>;
  createSale(
    sku: string,
    total: number,
    opts?: { shards?: number; ttlMs?: number; limit?: number },
  ): Promise<void>;
  /** ROOM.OPEN (admin): the same settings again are fine, others reject with `Exists`. */
  openRoom(sku: string, opts?: RoomOptions): Promise<void>;
  /** ROOM.JOIN. Rejects with `QueueFull`, `SoldOutError`, `TooManyJoins`, `NoRoom`, `NoSale`. */
  join(sku: string, user: string): Promise<RoomTicket>;
  /** ROOM.STATUS. Rejects with `BadTicket`, `NotQueued`, `NoRoom`, `NoSale`. */
  status(sku: string, user: string, ticket: string): Promise<RoomStatus>;
  /** ROOM.LEAVE: true if this call gave the user's place up. */
  leave(sku: string, user: string): Promise<boolean>;
  /** ROOM.INFO. Rejects with `NoRoom`. */
  roomInfo(sku: string): Promise<RoomInfo>;
  /**
   * SUBSCRIBE sale:<sku>:live on a connection of its own: the counts now, then one per
   * change. Rejects with `NoSale`, or `CommandError` at the server's watcher limit.
   */
  watchSale(sku: string, onCounts: (counts: LiveCounts) => void, opts?: WatchOptions): Promise<LiveWatch>;
  /**
   * SUBSCRIBE place:<ticket>: the counts with `you`, the buyer's place. Rejects with
   * `BadTicket` (forged or malformed ticket) or `NoRoom`.
   */
  watchPlace(ticket: string, onCounts: (counts: LiveCounts) => void, opts?: WatchOptions): Promise<LiveWatch>;
  /** A raw command (resent after a lost reply only when `idempotent`, the default). */
  /** `key`: in cluster mode, the sku or token whose slot's group gets the command. */
  call(args: (string | number)[], opts?: { idempotent?: boolean; deadlineMs?: number; key?: string }): Promise<unknown>;
  close(): Promise<void>;
}

// ---------------------------------------------------------------------------------------
// The checkout flow over the ledger

export type OrderStatus =
  | 'PENDING'
  | 'COMMITTED'
  | 'CANCELLED'
  | 'CANCELLED_BY_SWEEPER'
  | 'REFUND_REQUIRED'
  | 'REFUNDED';

/** A reservation materialized in the ledger as a PENDING (or already paid) order. */
export declare class Hold {
  readonly kind: 'hold';
  readonly token: string;
  readonly sku: string;
  readonly user: string;
  readonly requestId: string;
  readonly qty: number;
  readonly expiresAtMs: number;
  readonly createdAtMs: number;
  /** A retry of an earlier RESERVE (same request id): nothing new was taken. */
  readonly replay: boolean;
  /** Already paid (a retry after the payment). */
  readonly alreadyCommitted: boolean;
}

export type ReserveAndRecordResult = Hold | SoldOut | Limit | Denied;

/** The result of `pay` (a discriminated union on `kind`). */
export type PayResult =
  /** Sold. `serverConfirmed` false: the server could not be told yet; the sweeper finishes it. */
  | { readonly kind: 'committed'; readonly serverConfirmed: boolean }
  /** The same token was paid before (the token is the payment's idempotency key). */
  | { readonly kind: 'already_committed' }
  /** Refused and no money moved: do not capture. `status` null: no such order. */
  | { readonly kind: 'refused'; readonly status: OrderStatus | null }
  /**
   * Refused and no money moved: a part of a split sale, and the buyer's paid units of the
   * whole parent would exceed its per-user limit (the ledger's `pay_order`). Nothing
   * changed; release the hold or let it expire. With money moved: `refund_required`.
   */
  | { readonly kind: 'over_limit' }
  /** Money moved for a hold that was no longer ours to sell: refund it. */
  | { readonly kind: 'refund_required'; readonly previous: OrderStatus };

export interface CheckoutOptions {
  stockgate: Stockgate;
  /** A pg Pool of your own (the functions are called schema-qualified)... */
  pool?: Pool;
  /** ...or a Postgres URL for a pool made here (search_path set to the schema). */
  databaseUrl?: string;
  /** The ledger's schema (the tools' `--schema`). Default `stockgate`. */
  schema?: string;
  /** Size of the pool made from `databaseUrl`. Default 10. */
  poolSize?: number;
}

export declare class Checkout {
  constructor(opts: CheckoutOptions);
  readonly pool: Pool;
  /** Set once the server refused `COMMIT ... VERIFIED` to this client's role (-NOPERM): from then on the plain COMMIT is sent. */
  readonly plainCommitOnly: boolean;
  reserveAndRecord(args: {
    sku: string;
    user: string;
    admission: string;
    requestId: string;
    qty?: number;
  }): Promise<ReserveAndRecordResult>;
  pay(token: string, paymentRef: string, opts: { moneyMoved: boolean }): Promise<PayResult>;
  /** Whether this call returned the units to stock. */
  cancel(token: string): Promise<boolean>;
  extend(token: string, ms: number): Promise<number>;
  markRefunded(token: string): Promise<'REFUNDED' | 'ALREADY_REFUNDED'>;
  close(): Promise<void>;
}

/** Parts tried after the home part when it is sold out (docs/cluster.md, "A split sale"). */
export const MAX_PROBES: number;
/** 32-bit FNV-1a of the user's UTF-8 bytes: the same in the Rust and Python clients. */
export function userHash(user: string): number;
/** The buyer's home part among `parts`. */
export function homePart(user: string, parts: number): number;
/** The home, then the next MAX_PROBES parts after it, each once. */
export function probeOrder(user: string, parts: number): number[];
/** What reserveSplit got: `part` answered `outcome`; `tried` lists the parts asked. */
export interface SplitReserve {
  part: number;
  sku: string;
  tried: number[];
  outcome: ReserveResult;
}
/** Reserve on the home part, then at most two others after a SOLDOUT. */
export function reserveSplit(
  client: Stockgate | Stockgate[],
  parent: string,
  parts: string[],
  user: string,
  qty: number | undefined,
  opts: { admission: (sku: string) => string | Promise<string>; requestId: string },
): Promise<SplitReserve>;

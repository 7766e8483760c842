// The server's buyer and checkout commands over ioredis, with typed results and errors, one
// address, Sentinel discovery (a Raft group's members answer the Sentinel commands,
// docs/replication.md) or groups in cluster mode (ioredis `Cluster`, docs/cluster.md), and
// retries.
//
// Retries. Every command this class sends is safe to resend (docs/protocol.md section 10):
// RESERVE with the same request id answers REPLAY if the first send took effect and never
// takes stock twice; COMMIT, RELEASE and EXTEND act per token; the rest are reads. So after a
// lost reply (connection closed, command timeout) or a refusal that says the command did not
// run (`-READONLY`, `-LOADING`, `-NOREPLICAS`: a follower, a leader catching up, a failover),
// the same command with the same arguments is sent again, with backoff, until it gets an
// answer or the call's deadline passes (then `Unavailable`, the last failure as its `cause`).
// A raw `call(..., { idempotent: false })` is resent only after refusals.

import calculateSlot from 'cluster-key-slot';
import { Cluster, Command, Redis } from 'ioredis';

import {
  AdmissionDenied,
  StockgateError,
  Unavailable,
  errorFromReply,
} from './errors.js';
import {
  deniedFrom,
  parseCommit,
  parseInteger,
  parseRelease,
  parseReservation,
  parseReserve,
  parseRoomInfo,
  parseRoomJoin,
  parseRoomLeave,
  parseRoomStatus,
  parseSaleInfo,
} from './replies.js';
import { LiveWatch, placeChannel, saleChannel } from './live.js';

/** Refusals before the command ran: resent whatever the command (TRYAGAIN: the sale is
 * frozen for a move, which ends within seconds). */
const REFUSAL_CODES = new Set(['READONLY', 'LOADING', 'NOREPLICAS', 'TRYAGAIN']);
/** Redirections a cluster connection follows itself: one reaching #run is sent again. */
const CLUSTER_RETRIED = new Set(['MOVED', 'ASK', 'CLUSTERDOWN']);
const RELEASE_REASONS = new Set(['cancel', 'expired', 'admin', 'rebuild']);

/** A call whose reply was lost and which may not be resent: it may or may not have run. */
export class OutcomeUnknown extends StockgateError {}

function isReplyError(e) {
  return e !== null && typeof e === 'object' && e.name === 'ReplyError';
}

/**
 * The credentials of a redis:// URL (`redis://user:password@host:port`, or
 * `redis://:password@host:port`), percent-decoded; `{}` for anything else.
 */
function urlCredentials(s) {
  if (typeof s !== 'string' || !/^rediss?:\/\//i.test(s)) return {};
  const u = new URL(s);
  return {
    username: u.username ? decodeURIComponent(u.username) : undefined,
    password: u.password ? decodeURIComponent(u.password) : undefined,
  };
}

/** The credentials given, else the address's; given both ways, they must agree. */
function credentials(addr, username, password) {
  const url = urlCredentials(addr);
  for (const [name, given, inUrl] of [['username', username, url.username], ['password', password, url.password]]) {
    if (given !== undefined && inUrl !== undefined && given !== inUrl) {
      throw new TypeError(`the address carries one ${name} and the \`${name}\` option another`);
    }
  }
  return { username: username ?? url.username, password: password ?? url.password };
}

/** A list of addresses: an array, or one comma-separated string. */
function addressList(v, what) {
  const list = (Array.isArray(v) ? v : String(v).split(','))
    .map((s) => (typeof s === 'string' ? s.trim() : s))
    .filter((s) => s !== '');
  if (list.length === 0) throw new TypeError(`${what}: no address`);
  return list;
}

function hostPort(s, what) {
  if (typeof s === 'object' && s !== null) return { host: String(s.host), port: Number(s.port) };
  // A redis:// or rediss:// URL: its host and port (credentials go in `username`/`password`).
  const str = String(s).replace(/^rediss?:\/\/(?:[^@/]*@)?/i, '').replace(/\/.*$/, '');
  const i = str.lastIndexOf(':');
  const port = Number(str.slice(i + 1));
  if (i <= 0 || !Number.isInteger(port) || port <= 0 || port > 65535) {
    throw new TypeError(`${what}: expected host:port, got ${JSON.stringify(s)}`);
  }
  return { host: str.slice(0, i), port };
}

const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

export class Stockgate {
  /**
   * @param {object} opts see index.d.ts `StockgateOptions`
   */
  constructor(opts = {}) {
    const {
      addr,
      sentinels,
      cluster,
      name = 'stockgate',
      username,
      password,
      connections = 1,
      deadlineMs = 30000,
      commandTimeoutMs = 5000,
      backoffMinMs = 50,
      backoffMaxMs = 500,
      redisOptions = {},
      tls,
      onError,
    } = opts;
    if ([addr, sentinels, cluster].filter((v) => v !== undefined).length !== 1) {
      throw new TypeError('give exactly one of `addr`, `sentinels` and `cluster`');
    }
    if (!Number.isInteger(connections) || connections < 1) {
      throw new TypeError('connections must be a positive integer');
    }
    this.deadlineMs = deadlineMs;
    this.backoffMinMs = backoffMinMs;
    this.backoffMaxMs = backoffMaxMs;
    /** Commands sent again after a lost reply or a refusal, since this client was made. */
    this.retries = 0;
    this.onError = onError;
    const seed = cluster !== undefined ? addressList(cluster, 'cluster')[0] : addr;
    const creds = credentials(seed, username, password);
    const base = {
      username: creds.username,
      password: creds.password,
      commandTimeout: commandTimeoutMs,
      // Reconnect quickly: a failover takes about a second.
      retryStrategy: (times) => Math.min(times * 50, 500),
      maxRetriesPerRequest: 20,
      ...redisOptions,
    };
    // TLS to the server: `tls: {ca, cert, key}` (ioredis's, i.e. node's tls.connect
    // options; PEM strings or Buffers), `tls: true` for the system's roots, or a
    // rediss:// address. Not to Sentinels: their discovery would also need it.
    const rediss = typeof seed === 'string' && seed.toLowerCase().startsWith('rediss://');
    const tlsOpts = tls === true || (tls === undefined && rediss) ? {} : tls;
    if (tlsOpts !== undefined && tlsOpts !== false && sentinels !== undefined) {
      throw new TypeError('tls with sentinels is not supported: give `addr`');
    }
    /** Cluster mode: commands carry their key's slot (see #send). */
    this.isCluster = cluster !== undefined;
    if (this.isCluster) {
      this.conns = this.#clusterConns(addressList(cluster, 'cluster'), base, tlsOpts, connections);
      this.next = 0;
      return;
    }
    let options;
    if (sentinels !== undefined) {
      const list = addressList(sentinels, 'sentinels').map((s) => hostPort(s, 'sentinels'));
      options = {
        sentinels: list,
        name,
        sentinelUsername: username,
        sentinelPassword: password,
        sentinelRetryStrategy: (times) => Math.min(times * 50, 500),
        // A follower answers writes -READONLY: drop the connection so the next attempt asks
        // the sentinels again, and let the retry loop resend the command.
        reconnectOnError: (err) => (String(err.message).startsWith('READONLY') ? 1 : false),
        ...base,
      };
      this.target = `Sentinel ${list.map((s) => `${s.host}:${s.port}`).join(',')} (${name})`;
    } else {
      const hp = hostPort(addr, 'addr');
      options = { ...hp, ...base };
      if (tlsOpts !== undefined && tlsOpts !== false) {
        options.tls = { ...tlsOpts, ...(base.tls ?? {}) };
      }
      this.target = `${hp.host}:${hp.port}`;
    }
    /** @type {Redis[]} */
    this.conns = [];
    for (let i = 0; i < connections; i++) {
      const r = new Redis(options);
      // Connection errors show up in the calls (and are retried there); without a listener
      // ioredis would print each one.
      r.on('error', (e) => this.onError?.(e));
      this.conns.push(r);
    }
    this.next = 0;
  }

  /**
   * ioredis `Cluster`s over the seeds: each learns the slot map (CLUSTER SLOTS), sends a
   * command to the group owning its slot, and follows -MOVED and -ASK itself; a
   * redirection or -TRYAGAIN that outlasts its own attempts comes back to #run, which
   * sends the command again until the deadline.
   */
  #clusterConns(seeds, base, tlsOpts, connections) {
    const nodes = seeds.map((s) => hostPort(s, 'cluster'));
    const redisOptions = { ...base };
    if (tlsOpts !== undefined && tlsOpts !== false) {
      redisOptions.tls = { ...tlsOpts, ...(base.tls ?? {}) };
    }
    this.target = `cluster ${nodes.map((n) => `${n.host}:${n.port}`).join(',')}`;
    const conns = [];
    for (let i = 0; i < connections; i++) {
      const c = new Cluster(nodes, {
        redisOptions,
        clusterRetryStrategy: (times) => Math.min(times * 50, 500),
        retryDelayOnTryAgain: 100,
        retryDelayOnClusterDown: 100,
      });
      c.on('error', (e) => this.onError?.(e));
      conns.push(c);
    }
    return conns;
  }

  /**
   * One attempt of `args` on a connection. In cluster mode a command with a key is sent
   * with that key's slot: ioredis finds keys only in its list of Redis's own commands and
   * would send a stockgate command to a random node (one -MOVED more per call). A token's
   * `{sku}` hash tag gives the sku's slot, so the token is a key like the sku.
   */
  #send(conn, args, key) {
    const strs = args.map(String);
    if (!this.isCluster || key === undefined) return conn.call(...strs);
    const cmd = new Command(strs[0], strs.slice(1), { replyEncoding: 'utf8' });
    cmd.slot = calculateSlot(String(key));
    return conn.sendCommand(cmd);
  }

  /** Waits until every connection is ready (or the deadline passes). */
  async ready() {
    await Promise.all(this.conns.map(() => this.#run(['PING'])));
  }

  #pick() {
    const n = this.conns.length;
    for (let i = 0; i < n; i++) {
      const c = this.conns[(this.next + i) % n];
      if (c.status === 'ready') {
        this.next = (this.next + i + 1) % n;
        return c;
      }
    }
    const c = this.conns[this.next];
    this.next = (this.next + 1) % n;
    return c;
  }

  /**
   * Sends one command with the retry rules above; resolves to the raw reply, rejects with a
   * typed `StockgateError`.
   */
  async #run(args, { idempotent = true, deadlineMs, key } = {}) {
    const deadline = Date.now() + (deadlineMs ?? this.deadlineMs);
    for (let attempt = 1; ; attempt++) {
      let last;
      try {
        // The deadline bounds each attempt too: a connect that hangs or a reply slower than
        // the time left ends the call at its deadline, not at the command timeout.
        const left = deadline - Date.now();
        let timer;
        const timeout = new Promise((_, no) => {
          timer = setTimeout(() => no(new Error(`no reply within the ${left} ms left`)), Math.max(left, 1));
        });
        try {
          return await Promise.race([this.#send(this.#pick(), args, key), timeout]);
        } finally {
          clearTimeout(timer);
        }
      } catch (e) {
        if (isReplyError(e)) {
          const typed = errorFromReply(e.message, e);
          const retried = REFUSAL_CODES.has(typed.code) || (this.isCluster && CLUSTER_RETRIED.has(typed.code));
          if (!retried) throw typed;
          last = typed;
        } else if (!idempotent) {
          throw new OutcomeUnknown(
            'OUTCOME_UNKNOWN',
            `${args[0]}: the reply was lost (${e.message}); it may or may not have run`,
            { cause: e },
          );
        } else {
          last = e;
        }
      }
      const wait = Math.min(this.backoffMinMs * 2 ** Math.min(attempt - 1, 16), this.backoffMaxMs);
      if (Date.now() + wait > deadline) {
        throw new Unavailable(
          'UNAVAILABLE',
          `${args[0]} to ${this.target}: still failing after ${attempt} attempts: ${last.message}`,
          { cause: last },
        );
      }
      this.retries++;
      await sleep(wait);
    }
  }

  /**
   * A raw command, with the retry rules (resent after a lost reply only when `idempotent`).
   * Server errors reject as typed `StockgateError`s. In cluster mode, `key` (the sku, or a
   * token) sends it to the group owning that key's slot.
   */
  call(args, opts = {}) {
    return this.#run(args, opts);
  }

  /**
   * RESERVE sku user admission-token request-id [QTY n] [WITHLIMIT].
   * @returns {Promise<import('./replies.js').Reserved | import('./replies.js').Replay |
   *   import('./replies.js').SoldOut | import('./replies.js').Limit | import('./replies.js').Denied>}
   */
  async reserve(sku, user, admission, requestId, opts = {}) {
    const args = ['RESERVE', sku, user, admission, requestId];
    if (opts.qty !== undefined) args.push('QTY', opts.qty);
    if (opts.withLimit) args.push('WITHLIMIT');
    try {
      return parseReserve(await this.#run(args, { key: sku }));
    } catch (e) {
      if (e instanceof AdmissionDenied) return deniedFrom(e.detail, e.message);
      throw e;
    }
  }

  /**
   * COMMIT token [VERIFIED]: 'committed' (by this call) or 'already_committed'.
   * Rejects with `Expired`, `Released`, `NoReservation`, `Fenced`, `NoPerm`.
   */
  async commit(token, opts = {}) {
    const args = ['COMMIT', token];
    if (opts.verified) args.push('VERIFIED');
    return parseCommit(await this.#run(args, { key: token }));
  }

  /** RELEASE token [REASON r]: true if this call returned the units to stock. */
  async release(token, opts = {}) {
    const args = ['RELEASE', token];
    if (opts.reason !== undefined) {
      if (!RELEASE_REASONS.has(opts.reason)) {
        throw new TypeError('release reason must be one of cancel, expired, admin, rebuild');
      }
      args.push('REASON', opts.reason);
    }
    return parseRelease(await this.#run(args, { key: token }));
  }

  /** EXTEND token ms: the new expires_at_ms. Rejects with `NoReservation`, `Expired`. */
  async extend(token, ms) {
    return parseInteger(await this.#run(['EXTEND', token, ms], { key: token }), 'EXTEND');
  }

  /** RESERVATION token: the reservation, or null (unknown or purged). */
  async reservation(token) {
    return parseReservation(await this.#run(['RESERVATION', token], { key: token }));
  }

  /** STOCK sku: units available now. Rejects with `NoSale`. */
  async stock(sku) {
    return parseInteger(await this.#run(['STOCK', sku], { key: sku }), 'STOCK');
  }

  /** SALE.INFO sku. Rejects with `NoSale`. */
  async saleInfo(sku) {
    return parseSaleInfo(await this.#run(['SALE.INFO', sku], { key: sku }));
  }

  /**
   * SALE.CREATE sku total [SHARDS n] [TTL ms] [LIMIT n] (admin). The same parameters again
   * answer OK, so it is resent like the others; different ones reject with `Exists`.
   */
  async createSale(sku, total, opts = {}) {
    const args = ['SALE.CREATE', sku, total];
    if (opts.shards !== undefined) args.push('SHARDS', opts.shards);
    if (opts.ttlMs !== undefined) args.push('TTL', opts.ttlMs);
    if (opts.limit !== undefined) args.push('LIMIT', opts.limit);
    await this.#run(args, { key: sku });
  }

  // --- The waiting room (docs/protocol.md section 4a) -----------------------------------

  /**
   * ROOM.OPEN sku [OPENS-AT ms] [RATE n] [OVERADMIT permille] [ADMIT-TTL ms] [WINDOW ms]
   * [MAX n] (admin); an option left out is the server's default. The same settings again
   * answer OK; other settings reject with `Exists`, an unknown sale with `NoSale`, one out
   * of range with `CommandError`.
   */
  async openRoom(sku, opts = {}) {
    const args = ['ROOM.OPEN', sku];
    for (const [word, v] of [
      ['OPENS-AT', opts.opensAtMs],
      ['RATE', opts.rate],
      ['OVERADMIT', opts.overadmitPermille],
      ['ADMIT-TTL', opts.admitTtlMs],
      ['WINDOW', opts.windowMs],
      ['MAX', opts.maxWaiting],
    ]) {
      if (v !== undefined) args.push(word, v);
    }
    await this.#run(args, { key: sku });
  }

  /**
   * ROOM.JOIN sku user: `{ ticket, position, etaMs }`, the same ticket again while the user
   * holds a place (so a lost reply is sent again). Rejects with `QueueFull`, `SoldOutError`,
   * `TooManyJoins`, `NoRoom`, `NoSale`.
   */
  async join(sku, user) {
    return parseRoomJoin(await this.#run(['ROOM.JOIN', sku, user], { key: sku }));
  }

  /**
   * ROOM.STATUS sku user ticket: the place's status (see `parseRoomStatus`); an `admitted`
   * one carries the admission token for `reserve`. Rejects with `BadTicket`, `NotQueued`,
   * `NoRoom`, `NoSale`.
   */
  async status(sku, user, ticket) {
    return parseRoomStatus(await this.#run(['ROOM.STATUS', sku, user, ticket], { key: sku }));
  }

  /**
   * ROOM.LEAVE sku user: true if this call gave the user's place up, false if the user held
   * none (also when a lost reply's first send gave it up). Rejects with `NoRoom`, `NoSale`.
   */
  async leave(sku, user) {
    return parseRoomLeave(await this.#run(['ROOM.LEAVE', sku, user], { key: sku }));
  }

  /** ROOM.INFO sku: the room's settings and counts. Rejects with `NoRoom`. */
  async roomInfo(sku) {
    return parseRoomInfo(await this.#run(['ROOM.INFO', sku], { key: sku }));
  }

  // --- Live counts over RESP (docs/protocol.md section 4a, "Live counts over RESP") -----

  /**
   * SUBSCRIBE sale:<sku>:live on a connection of its own (a `duplicate()` of this
   * client's): `onCounts` gets the counts now at once, then one per change (at most ~10 a
   * second). Resolves to a `LiveWatch` once subscribed (`onCounts` may run before);
   * rejects with `NoSale` for an unknown sale, `CommandError` when the server has its most
   * watchers. `opts.onError` gets connection errors (ioredis reconnects and subscribes
   * again) and payloads of another shape (`ProtocolMismatch`). `close()` the watch to
   * free the server's watcher.
   */
  watchSale(sku, onCounts, opts = {}) {
    return this.#watch(saleChannel(sku), onCounts, opts);
  }

  /**
   * SUBSCRIBE place:<ticket> (the ticket `join` gave): as `watchSale`, each message with
   * `you`, the buyer's place (`kind` as `status`'s, plus `gone`; `admitted` carries no
   * token: `status` gives it). The ticket is checked once, here: a forged or malformed one
   * rejects with `BadTicket`, one of a sale without a room with `NoRoom`.
   */
  watchPlace(ticket, onCounts, opts = {}) {
    return this.#watch(placeChannel(ticket), onCounts, opts);
  }

  #watch(channel, onCounts, { onError } = {}) {
    if (typeof onCounts !== 'function') throw new TypeError('onCounts must be a function');
    const sub = this.conns[0].duplicate();
    return new LiveWatch(sub, channel, onCounts, onError ?? this.onError).start();
  }

  /** Closes every connection. */
  async close() {
    await Promise.all(
      this.conns.map(async (c) => {
        if (c.status !== 'ready') {
          c.disconnect();
          return;
        }
        try {
          await c.quit();
        } catch {
          c.disconnect();
        }
      }),
    );
  }
}

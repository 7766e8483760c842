// A sale's live counts and a buyer's place, pushed by the server over RESP pub/sub
// (docs/protocol.md section 4a, "Live counts over RESP"): `SUBSCRIBE sale:<sku>:live` or
// `SUBSCRIBE place:<ticket>` on a connection of the watch's own (an ioredis `duplicate()`
// of the client's), each message parsed and handed to the caller's callback.
//
// ioredis reconnects a subscriber and subscribes again by itself; the server answers every
// new subscription with the counts now, so a watch that lived through a reconnect only
// missed intermediate states.

import { Unavailable, errorFromReply } from './errors.js';
import { parseLive } from './replies.js';

export const saleChannel = (sku) => `sale:${sku}:live`;
export const placeChannel = (ticket) => `place:${ticket}`;

function isReplyError(e) {
  return e !== null && typeof e === 'object' && e.name === 'ReplyError';
}

/** One live channel's subscription; `close()` ends it and frees the server's watcher. */
export class LiveWatch {
  /**
   * @param {import('ioredis').Redis | import('ioredis').Cluster} sub a connection of its own
   * @param {string} channel
   * @param {(counts: object) => void} onCounts
   * @param {(err: Error) => void} [onError]
   */
  constructor(sub, channel, onCounts, onError) {
    this.channel = channel;
    this.closed = false;
    this.sub = sub;
    // Connection errors are ioredis's to recover from (it reconnects and subscribes
    // again); without a listener it would print each one.
    sub.on('error', (e) => onError?.(e));
    // Listening before SUBSCRIBE is sent: the first message (the counts now) may come
    // in the same read as the confirmation, before the subscribe call resolves.
    sub.on('message', (ch, message) => {
      if (ch !== channel || this.closed) return;
      let counts;
      try {
        counts = parseLive(message);
      } catch (e) {
        onError?.(e);
        return;
      }
      onCounts(counts);
    });
  }

  /** Subscribes; rejects with the typed error the server sent instead of the confirmation. */
  async start() {
    try {
      await this.sub.subscribe(this.channel);
    } catch (e) {
      await this.close();
      if (isReplyError(e)) throw errorFromReply(e.message, e);
      throw new Unavailable('UNAVAILABLE', `SUBSCRIBE ${this.channel}: ${e.message}`, { cause: e });
    }
    return this;
  }

  /** Closes the watch's connection (the server frees its watcher). */
  async close() {
    if (this.closed) return;
    this.closed = true;
    if (this.sub.status !== 'ready') {
      this.sub.disconnect();
      return;
    }
    try {
      await this.sub.quit();
    } catch {
      this.sub.disconnect();
    }
  }
}

// A sale split over several groups (docs/cluster.md, "A split sale"): each buyer has a home
// part, a hash of the user that the Rust and Python clients compute the same way, and is
// sent to at most two more parts when the home answers SOLDOUT.

/** Parts tried after the home part when it is sold out. */
export const MAX_PROBES = 2;

/**
 * 32-bit FNV-1a of the user's UTF-8 bytes (shared vectors: tests/split/vectors.json).
 * @param {string} user
 * @returns {number}
 */
export function userHash(user) {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(user, 'utf8')) {
    h = Math.imul(h ^ b, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

/**
 * The buyer's home part among `parts` (0 when there are none).
 * @param {string} user
 * @param {number} parts
 */
export function homePart(user, parts) {
  return parts > 0 ? userHash(user) % parts : 0;
}

/**
 * The home, then the next MAX_PROBES parts after it (wrapping), each once.
 * @param {string} user
 * @param {number} parts
 * @returns {number[]}
 */
export function probeOrder(user, parts) {
  const home = homePart(user, parts);
  const n = Math.min(parts, MAX_PROBES + 1);
  return Array.from({ length: n }, (_, k) => (home + k) % parts);
}

/**
 * Reserve `qty` units of the split sale `parent` whose part skus are `parts` (index order,
 * as `stockgate-sweeper split` printed them): the home part, then at most two others, each
 * only after the one before answered SOLDOUT (any other answer, a Limit included, is
 * final). `client` is one Stockgate for every part or an array of them, one per part;
 * `admission(sku)` gives the admission token for that part and this user.
 * @returns {Promise<{part: number, sku: string, tried: number[], outcome: any}>}
 */
export async function reserveSplit(client, parent, parts, user, qty, { admission, requestId }) {
  if (!parts.length) throw new TypeError('reserveSplit: no parts');
  const clients = Array.isArray(client) ? client : parts.map(() => client);
  if (clients.length !== parts.length) {
    throw new TypeError(`reserveSplit: ${parts.length} parts and ${clients.length} clients: give one client per part`);
  }
  const tried = [];
  let outcome;
  for (const i of probeOrder(user, parts.length)) {
    tried.push(i);
    const opts = qty === undefined || qty === 1 ? {} : { qty };
    outcome = await clients[i].reserve(parts[i], user, await admission(parts[i]), requestId, opts);
    if (outcome.kind !== 'soldout') break;
  }
  const part = tried[tried.length - 1];
  return { part, sku: parts[part], tried, outcome };
}

// Compiled by `tsc --noEmit -p test/tsconfig.json` (types.test.js): the shipped index.d.ts
// type-checks, and an application using the package the documented way type-checks too,
// with the discriminated unions narrowing as they should. `@ts-expect-error` lines are
// mistakes the types must catch (tsc fails if one of them compiles).

import {
  AdmissionMinter,
  BadTicket,
  Checkout,
  Expired,
  NoRoom,
  NotQueued,
  OrderRefused,
  QueueFull,
  SoldOutError,
  Stockgate,
  StockgateError,
  TooManyJoins,
  Unavailable,
  type LiveCounts,
  type LiveWatch,
  type PayResult,
  type PlaceStatus,
  type Reservation,
  type ReserveAndRecordResult,
  type ReserveResult,
  type RoomInfo,
  type RoomStatus,
  type RoomTicket,
  type SaleInfo,
} from 'stockgate';

function never(x: never): never {
  throw new Error(`unexpected ${String(x)}`);
}

export function describeReserve(r: ReserveResult): string {
  switch (r.kind) {
    case 'reserved':
    case 'replay':
      return `${r.token} until ${r.expiresAtMs} on shard ${r.shard}`;
    case 'soldout':
      // @ts-expect-error a SOLDOUT has no token
      return r.token;
    case 'limit':
      return `${r.liveTokens.length} live, limit ${r.limit ?? '?'} held ${r.held ?? '?'}`;
    case 'denied':
      return r.reason === 'expired' ? 'get a new admission token' : r.message;
    default:
      return never(r);
  }
}

export function describePay(p: PayResult): string {
  switch (p.kind) {
    case 'committed':
      return p.serverConfirmed ? 'sold' : 'sold (server told later)';
    case 'already_committed':
      return 'paid before';
    case 'refused':
      return `refused (${p.status ?? 'no order'})`;
    case 'over_limit':
      return "refused (over the split sale's per-user limit)";
    case 'refund_required':
      return `refund (was ${p.previous})`;
    default:
      return never(p);
  }
}

export function describeReservation(r: Reservation | null): string {
  if (r === null) return 'unknown';
  switch (r.state) {
    case 'RESERVED':
    case 'COMMITTED':
    case 'RELEASED':
      return `${r.sku}/${r.user}/${r.requestId}: ${r.qty} ${r.state} ${r.createdAtMs}`;
    default:
      return never(r);
  }
}

export function left(s: SaleInfo): number {
  if (s.state === 'FENCED') return 0;
  // @ts-expect-error not a sale state
  if (s.state === 'CLOSED') return -1;
  return s.available;
}

export async function checkoutFlow(): Promise<void> {
  const sg = new Stockgate({ sentinels: '127.0.0.1:7001,127.0.0.1:7002', name: 'stockgate' });
  const one = new Stockgate({ addr: { host: '127.0.0.1', port: 7379 }, connections: 4 });
  // @ts-expect-error exactly one of addr and sentinels
  new Stockgate({ addr: '127.0.0.1:7379', sentinels: ['127.0.0.1:7001'] });
  const minter = AdmissionMinter.fromFile('/etc/stockgate/secret', { ttlMs: 30000 });
  const co = new Checkout({ stockgate: sg, databaseUrl: 'postgres://localhost/shop' });
  const r: ReserveAndRecordResult = await co.reserveAndRecord({
    sku: 'FLASH',
    user: 'alice',
    admission: minter.mint('FLASH', 'alice'),
    requestId: 'order-17',
  });
  if (r.kind !== 'hold') return;
  const t: string = r.token;
  // @ts-expect-error moneyMoved is required
  await co.pay(t, 'pay-1', {});
  const p = await co.pay(t, 'pay-1', { moneyMoved: true });
  describePay(p);
  try {
    await co.cancel(t);
  } catch (e) {
    if (e instanceof OrderRefused) console.log(e.status, e.code);
    else if (e instanceof Unavailable || e instanceof Expired) console.log(e.cause);
    else if (e instanceof StockgateError) console.log(e.code, e.detail);
  }
  const plain: boolean = co.plainCommitOnly;
  // @ts-expect-error set by the checkout itself, after -NOPERM
  co.plainCommitOnly = true;
  const refunded: 'REFUNDED' | 'ALREADY_REFUNDED' = await co.markRefunded(t);
  console.log(plain, refunded, await co.extend(t, 30000));
  const c: 'committed' | 'already_committed' = await one.commit(t, { verified: true });
  // @ts-expect-error not a release reason
  await one.release(t, { reason: 'bored' });
  const n: number = await one.stock('FLASH');
  console.log(c, n, await one.extend(t, 60000));
  await co.close();
  await sg.close();
}

export function describeRoom(s: RoomStatus): string {
  switch (s.kind) {
    case 'waiting':
      return `#${s.position}, about ${s.etaMs} ms`;
    case 'admitted':
      return `reserve with ${s.admission} before ${s.untilMs}`;
    case 'before_open':
      return `opens at ${s.opensAtMs}`;
    case 'reserved':
    case 'soldout':
    case 'left':
      // @ts-expect-error only an ADMITTED status carries an admission token
      return s.admission;
    case 'expired':
      return 'join again';
    default:
      return never(s);
  }
}

export async function waitingRoom(sg: Stockgate): Promise<void> {
  await sg.openRoom('FLASH', { rate: 200, admitTtlMs: 120000, maxWaiting: 100000 });
  // @ts-expect-error not a ROOM.OPEN setting
  await sg.openRoom('FLASH', { speed: 3 });
  let place: RoomTicket;
  try {
    place = await sg.join('FLASH', 'alice');
  } catch (e) {
    if (e instanceof QueueFull) console.log(e.maxWaiting ?? 'full');
    else if (e instanceof SoldOutError || e instanceof TooManyJoins || e instanceof NoRoom) console.log(e.code);
    return;
  }
  const s = await sg.status('FLASH', 'alice', place.ticket).catch((e: unknown) => {
    if (e instanceof BadTicket) return e.stale ? 'stale' : 'forged';
    if (e instanceof NotQueued) return 'gone';
    throw e;
  });
  if (typeof s === 'string') return;
  if (s.kind === 'admitted') {
    const r: ReserveResult = await sg.reserve('FLASH', 'alice', s.admission, 'order-17');
    console.log(describeReserve(r));
  }
  const gaveUp: boolean = await sg.leave('FLASH', 'alice');
  const info: RoomInfo = await sg.roomInfo('FLASH');
  const open: boolean = info.open;
  // @ts-expect-error counts are numbers
  const w: string = info.waiting;
  console.log(gaveUp, open, w, info.soldOut, info.maxWaiting, describeRoom(s));
}

export function describePlace(p: PlaceStatus): string {
  switch (p.kind) {
    case 'waiting':
      return `#${p.position}, about ${p.etaMs} ms`;
    case 'admitted':
      // @ts-expect-error the live channel carries no admission token: status() gives it
      return p.admission;
    case 'before_open':
      return `opens at ${p.opensAtMs}`;
    case 'reserved':
    case 'soldout':
    case 'expired':
    case 'left':
    case 'gone':
      return p.kind;
    default:
      return never(p);
  }
}

export async function liveCounts(sg: Stockgate, ticket: string): Promise<void> {
  const sale: LiveWatch = await sg.watchSale('FLASH', (c: LiveCounts) => {
    const left: number = c.available;
    // @ts-expect-error `room` is a boolean
    const r: number = c.room;
    console.log(left, r, c.held, c.sold, c.waiting, c.admitted, c.state === 'GONE');
  });
  const place = await sg.watchPlace(ticket, (c) => {
    if (c.you !== undefined) console.log(describePlace(c.you));
  }, { onError: (e: Error) => console.log(e.message) });
  // @ts-expect-error onCounts is required
  await sg.watchSale('FLASH');
  await Promise.all([sale.close(), place.close()]);
}

// stockgate for Node: the server's commands with typed results and errors, admission-token
// minting, Sentinel discovery and retries (client.js), and the checkout flow over the
// Postgres ledger's functions (checkout.js).

export { Stockgate, OutcomeUnknown } from './client.js';
export { Checkout, Hold } from './checkout.js';
export { MAX_PROBES, homePart, probeOrder, reserveSplit, userHash } from './split.js';
export {
  AdmissionMinter,
  SecretFileError,
  isValidSku,
  isValidUser,
  mintAdmissionToken,
  parseSecretFile,
} from './token.js';
export {
  Denied,
  Limit,
  ProtocolMismatch,
  Replay,
  Reserved,
  SoldOut,
  parseCommit,
  parseRelease,
  parseReservation,
  parseReserve,
  parseSaleInfo,
} from './replies.js';
export {
  AdmissionDenied,
  Ask,
  BusyGroup,
  ClusterDown,
  CrossSlot,
  CommandError,
  ExecAbort,
  Exists,
  Expired,
  Fenced,
  LedgerError,
  LedgerInvalidArgument,
  Loading,
  Moved,
  NoAuth,
  NoGoodSlave,
  NoGroup,
  NoPerm,
  NoProto,
  NoQuorum,
  NoReplicas,
  NoReservation,
  NoSale,
  OrderConflict,
  OrderNotFound,
  OrderRefused,
  Paused,
  ReadOnly,
  Released,
  StockgateError,
  TryAgain,
  Unavailable,
  WrongPass,
  deniedReason,
  errorFromReply,
  ledgerErrorFrom,
} from './errors.js';

//! The command table: arity, flags, key positions (for cluster-aware clients, via
//! COMMAND INFO) and which roles may run each command.

/// Role bits (defined beside `Role`). `OPEN` commands (connection commands and INFO) are
/// allowed to every role.
pub use crate::session::{ADMIN, CHECKOUT, REPLICATION, SENTINEL, SWEEPER};
/// Every role, and a connection before AUTH where no password is set.
pub const OPEN: u8 = 0xff;

/// One command's entry: how it is checked, routed and described.
pub struct Spec {
    /// Lower case, as looked up.
    pub name: &'static str,
    /// Redis convention: exact count including the name, or -N for "at least N".
    pub arity: i64,
    /// Redis's command flags (`write`, `readonly`, `fast`, ...) as COMMAND shows them.
    pub flags: &'static [&'static str],
    /// Position of the first key (the sku) in argv; 0 for none.
    pub first_key: i64,
    /// Position of the last key; negative counts from the end.
    pub last_key: i64,
    /// Distance between keys; 0 without keys.
    pub step: i64,
    /// The role bits that may run it.
    pub roles: u8,
    /// May run before AUTH when passwords are configured.
    pub no_auth: bool,
    /// COMMAND DOCS's group (`stock`, `server`, `connection`, ...).
    pub group: &'static str,
    /// One line for COMMAND DOCS and HELP.
    pub summary: &'static str,
}

const fn spec(
    name: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    key: i64,
    roles: u8,
    group: &'static str,
    summary: &'static str,
) -> Spec {
    Spec {
        name,
        arity,
        flags,
        first_key: key,
        last_key: key,
        step: if key > 0 { 1 } else { 0 },
        roles,
        no_auth: false,
        group,
        summary,
    }
}

const W: &[&str] = &["write", "fast"];
const R: &[&str] = &["readonly", "fast"];
const C: &[&str] = &["fast", "stale", "loading"];
const TX: &[&str] = &["noscript", "loading", "stale", "fast", "allow_busy"];

/// Every command the server knows, in COMMAND LIST's order.
pub static COMMANDS: &[Spec] = &[
    // Buyer path. Tokens carry the `{sku}` hash tag, so they route like the sku.
    spec(
        "reserve",
        -5,
        W,
        1,
        CHECKOUT | ADMIN,
        "stockgate",
        "Reserve units of a sale for a user",
    ),
    spec(
        "stock",
        2,
        R,
        1,
        CHECKOUT | ADMIN,
        "stockgate",
        "Units available now",
    ),
    spec(
        "reservation",
        2,
        R,
        1,
        CHECKOUT | SWEEPER | ADMIN,
        "stockgate",
        "Show a reservation",
    ),
    spec(
        "extend",
        3,
        W,
        1,
        CHECKOUT | ADMIN,
        "stockgate",
        "Push back a reservation's expiry",
    ),
    spec(
        "commit",
        -2,
        W,
        1,
        CHECKOUT | SWEEPER | ADMIN,
        "stockgate",
        "Commit a reservation",
    ),
    spec(
        "release",
        -2,
        W,
        1,
        CHECKOUT | SWEEPER | ADMIN,
        "stockgate",
        "Return a reservation's units to stock",
    ),
    spec(
        "expired",
        -1,
        R,
        0,
        SWEEPER | ADMIN,
        "stockgate",
        "List expired reservations",
    ),
    // Administration.
    spec("sale.create", -3, W, 1, ADMIN, "stockgate", "Create a sale"),
    spec(
        "sale.info",
        2,
        R,
        1,
        ADMIN,
        "stockgate",
        "Show a sale's counters",
    ),
    spec("sale.list", 1, R, 0, ADMIN, "stockgate", "List sales"),
    spec("sale.pause", 2, W, 1, ADMIN, "stockgate", "Pause a sale"),
    spec("sale.resume", 2, W, 1, ADMIN, "stockgate", "Resume a sale"),
    spec(
        "sale.adjust",
        3,
        W,
        1,
        ADMIN,
        "stockgate",
        "Restock or withdraw units",
    ),
    spec(
        "sale.fence",
        -2,
        W,
        1,
        ADMIN,
        "stockgate",
        "Fence a sale until it is rebuilt",
    ),
    spec(
        "sale.restore",
        -7,
        W,
        1,
        ADMIN,
        "stockgate",
        "Restore a ledger-verified reservation (pending, committed or released)",
    ),
    spec(
        "sale.rebuild",
        5,
        W,
        1,
        ADMIN,
        "stockgate",
        "Rebuild a fenced sale's counters",
    ),
    // The waiting room (cmd/room.rs): the checkout service queues buyers on their behalf.
    // JOIN, STATUS and LEAVE write: each may log the room's moves (admissions, expiries).
    spec(
        "room.open",
        -2,
        W,
        1,
        ADMIN,
        "stockgate",
        "Give a sale a waiting room",
    ),
    spec(
        "room.join",
        3,
        W,
        1,
        CHECKOUT | ADMIN,
        "stockgate",
        "Queue a buyer for a sale (the same ticket again on a repeat)",
    ),
    spec(
        "room.status",
        4,
        W,
        1,
        CHECKOUT | ADMIN,
        "stockgate",
        "A queue ticket's status (ADMITTED with the admission token)",
    ),
    spec(
        "room.leave",
        3,
        W,
        1,
        CHECKOUT | ADMIN,
        "stockgate",
        "Give up a place in a sale's queue",
    ),
    spec(
        "room.info",
        2,
        R,
        1,
        CHECKOUT | ADMIN,
        "stockgate",
        "A waiting room's settings and counts",
    ),
    spec(
        "sale.import",
        -2,
        &["write"],
        0,
        ADMIN,
        "stockgate",
        "Install a sale another group exported (the destination's half of SALE.MIGRATE)",
    ),
    spec(
        "sale.migrate",
        4,
        &["write"],
        0,
        ADMIN,
        "stockgate",
        "Move one sale to another group's node: freeze, send, drop here",
    ),
    spec(
        "save",
        1,
        &["admin"],
        0,
        ADMIN,
        "server",
        "Write a snapshot now",
    ),
    spec(
        "backup",
        2,
        &["admin", "noscript"],
        0,
        ADMIN,
        "server",
        "Write a consistent copy of the data dir (snapshot and log up to one LSN) into a new or empty directory",
    ),
    // Connection and server.
    Spec {
        no_auth: true,
        ..spec("auth", -2, C, 0, OPEN, "connection", "Authenticate")
    },
    Spec {
        no_auth: true,
        ..spec("hello", -1, C, 0, OPEN, "connection", "Handshake")
    },
    Spec {
        no_auth: true,
        ..spec("quit", -1, C, 0, OPEN, "connection", "Close the connection")
    },
    Spec {
        no_auth: true,
        ..spec("reset", 1, C, 0, OPEN, "connection", "Reset the connection")
    },
    spec("ping", -1, C, 0, OPEN, "connection", "Ping"),
    spec("echo", 2, C, 0, OPEN, "connection", "Echo"),
    spec(
        "client",
        -2,
        C,
        0,
        OPEN,
        "connection",
        "Connection settings",
    ),
    spec("select", 2, C, 0, OPEN, "connection", "Select database 0"),
    spec(
        "shutdown",
        -1,
        &["admin", "noscript", "loading", "stale", "no_multi", "allow_busy"],
        0,
        ADMIN,
        "server",
        "Flush and close the log, then exit (SHUTDOWN [NOSAVE|SAVE])",
    ),
    spec(
        "command",
        -1,
        &["loading", "stale"],
        0,
        OPEN,
        "server",
        "Command introspection",
    ),
    spec(
        "info",
        -1,
        &["loading", "stale"],
        0,
        OPEN,
        "server",
        "Server information",
    ),
    spec(
        "config",
        -2,
        &["admin"],
        0,
        ADMIN | SENTINEL,
        "server",
        "Configuration: GET, SET (live settings), REWRITE (into the config file), RESETSTAT",
    ),
    spec(
        "acl",
        -2,
        &["admin", "noscript", "loading", "stale"],
        0,
        OPEN,
        "server",
        "Users: WHOAMI (any user), LIST, USERS, GETUSER, SETUSER, DELUSER, SAVE, LOAD (admin)",
    ),
    spec(
        "secret.reload",
        1,
        &["admin", "noscript", "loading", "stale"],
        0,
        ADMIN,
        "server",
        "Read the admission secret file again: its keys verify from the next RESERVE on",
    ),
    spec("time", 1, C, 0, ADMIN, "server", "Server time"),
    spec(
        "latency",
        -2,
        &["admin", "loading", "stale"],
        0,
        ADMIN,
        "server",
        "Latency histograms per command (HISTOGRAM), LATEST, RESET",
    ),
    spec(
        "slowlog",
        -2,
        &["admin", "loading", "stale"],
        0,
        ADMIN,
        "server",
        "The slow log: GET [count], LEN, RESET",
    ),
    spec(
        "dbsize",
        1,
        R,
        0,
        ADMIN,
        "server",
        "Number of reservations held",
    ),
    // The order feed (cmd/stream.rs): the log as streams, readable by the sweeper role
    // (the materializer runs as it) and admin. XREAD's keys move (after STREAMS), as in
    // Redis; the others take the stream at position 1 (XINFO: 2).
    Spec {
        first_key: 0,
        last_key: 0,
        step: 0,
        ..spec(
            "xread",
            -4,
            &["readonly", "blocking", "movablekeys"],
            0,
            SWEEPER | ADMIN,
            "stream",
            "Read the order feed after the given ids, optionally blocking",
        )
    },
    spec(
        "xrange",
        -4,
        &["readonly"],
        1,
        SWEEPER | ADMIN,
        "stream",
        "Order feed entries in an id range",
    ),
    spec(
        "xrevrange",
        -4,
        &["readonly"],
        1,
        SWEEPER | ADMIN,
        "stream",
        "Order feed entries in an id range, newest first",
    ),
    spec(
        "xlen",
        2,
        &["readonly", "fast"],
        1,
        SWEEPER | ADMIN,
        "stream",
        "Entries in an order feed stream",
    ),
    spec(
        "xinfo",
        -3,
        &["readonly"],
        2,
        SWEEPER | ADMIN,
        "stream",
        "XINFO STREAM|GROUPS|CONSUMERS: an order feed stream, its groups, their consumers",
    ),
    // Consumer groups (cmd/group/): their state is in the log, so these write.
    spec(
        "xgroup",
        -2,
        &["write"],
        2,
        SWEEPER | ADMIN,
        "stream",
        "XGROUP CREATE|SETID|DESTROY|CREATECONSUMER|DELCONSUMER: manage consumer groups",
    ),
    Spec {
        first_key: 0,
        last_key: 0,
        step: 0,
        ..spec(
            "xreadgroup",
            -7,
            &["write", "blocking", "movablekeys"],
            0,
            SWEEPER | ADMIN,
            "stream",
            "Read the order feed as a consumer of a group, optionally blocking",
        )
    },
    spec(
        "xack",
        -4,
        &["write", "fast"],
        1,
        SWEEPER | ADMIN,
        "stream",
        "Acknowledge entries of a consumer group",
    ),
    spec(
        "xpending",
        -3,
        &["readonly"],
        1,
        SWEEPER | ADMIN,
        "stream",
        "A consumer group's pending entries",
    ),
    spec(
        "xclaim",
        -6,
        &["write", "fast"],
        1,
        SWEEPER | ADMIN,
        "stream",
        "Move pending entries to another consumer",
    ),
    spec(
        "xautoclaim",
        -6,
        &["write", "fast"],
        1,
        SWEEPER | ADMIN,
        "stream",
        "Move idle pending entries to another consumer, cursor-style",
    ),
    // Replication and Sentinel (cmd/replication.rs, crate::raft, crate::pubsub).
    spec(
        "replicaof",
        3,
        &["admin", "noscript", "stale"],
        0,
        ADMIN | SENTINEL,
        "server",
        "Follow a primary, or become one (NO ONE)",
    ),
    spec(
        "slaveof",
        3,
        &["admin", "noscript", "stale"],
        0,
        ADMIN | SENTINEL,
        "server",
        "REPLICAOF's old name (Sentinel sends it)",
    ),
    spec(
        "role",
        1,
        &["noscript", "loading", "stale", "fast"],
        0,
        OPEN,
        "server",
        "This node's role in replication",
    ),
    // A Raft group (crate::raft): Sentinel's discovery commands answered by every
    // member, and the membership commands.
    spec(
        "sentinel",
        -2,
        &["admin", "noscript", "loading", "stale"],
        0,
        OPEN,
        "sentinel",
        "Sentinel discovery: who leads the group, its members",
    ),
    spec(
        "raft.members",
        1,
        &["admin", "noscript", "loading", "stale"],
        0,
        ADMIN,
        "server",
        "The group's members: id, client address, raft address, role",
    ),
    spec(
        "raft.add",
        4,
        &["admin", "noscript"],
        0,
        ADMIN,
        "server",
        "Add a member (a learner first, then a voter): id client-addr raft-addr",
    ),
    spec(
        "raft.remove",
        2,
        &["admin", "noscript"],
        0,
        ADMIN,
        "server",
        "Remove a member from the voters",
    ),
    spec(
        "raft.readmit",
        2,
        &["admin", "noscript"],
        0,
        ADMIN,
        "server",
        "Re-admit a member that lost its state: remove, add as a learner, promote once caught up",
    ),
    spec(
        "wait",
        3,
        &["noscript"],
        0,
        CHECKOUT | SWEEPER | ADMIN,
        "generic",
        "Wait until replicas have this server's log so far",
    ),
    spec(
        "replconf",
        -1,
        &["admin", "noscript", "loading", "stale"],
        0,
        ADMIN | REPLICATION,
        "server",
        "Refused: stockgate replicates through a Raft group",
    ),
    spec(
        "psync",
        -3,
        &["admin", "noscript"],
        0,
        ADMIN | REPLICATION,
        "server",
        "Refused: stockgate replicates through a Raft group",
    ),
    spec(
        "sync",
        1,
        &["admin", "noscript"],
        0,
        ADMIN | REPLICATION,
        "server",
        "Refused: stockgate replicates through a Raft group",
    ),
    spec(
        "publish",
        3,
        &["pubsub", "loading", "stale", "fast"],
        0,
        ADMIN | SENTINEL,
        "pubsub",
        "Publish a message on a channel",
    ),
    spec(
        "subscribe",
        -2,
        &["pubsub", "noscript", "loading", "stale"],
        0,
        ADMIN | SENTINEL | CHECKOUT,
        "pubsub",
        "Listen to channels",
    ),
    spec(
        "unsubscribe",
        -1,
        &["pubsub", "noscript", "loading", "stale"],
        0,
        ADMIN | SENTINEL | CHECKOUT,
        "pubsub",
        "Stop listening to channels",
    ),
    spec(
        "psubscribe",
        -2,
        &["pubsub", "noscript", "loading", "stale"],
        0,
        ADMIN | SENTINEL,
        "pubsub",
        "Listen to channels matching patterns",
    ),
    spec(
        "punsubscribe",
        -1,
        &["pubsub", "noscript", "loading", "stale"],
        0,
        ADMIN | SENTINEL,
        "pubsub",
        "Stop listening to patterns",
    ),
    // Cluster mode (cmd/cluster.rs): what Redis Cluster clients ask on connect and send
    // around redirections. Open to every role: a checkout client routes with them.
    spec(
        "cluster",
        -2,
        &["loading", "stale"],
        0,
        OPEN,
        "cluster",
        "CLUSTER SLOTS|SHARDS|NODES|INFO|MYID|KEYSLOT|HELP: the slot map",
    ),
    spec(
        "readonly",
        1,
        &["loading", "stale", "fast"],
        0,
        OPEN,
        "cluster",
        "Accepted in cluster mode: reads are served by each group's leader",
    ),
    spec(
        "readwrite",
        1,
        &["loading", "stale", "fast"],
        0,
        OPEN,
        "cluster",
        "Accepted in cluster mode",
    ),
    spec(
        "asking",
        1,
        &["fast"],
        0,
        OPEN,
        "cluster",
        "The next command may run on a slot this node is importing",
    ),
    // Transactions (cmd/multi.rs). Open to every role: each queued command is checked
    // against the role when it is queued and again when EXEC runs it.
    spec(
        "multi",
        1,
        TX,
        0,
        OPEN,
        "transactions",
        "Start a transaction",
    ),
    spec(
        "exec",
        1,
        &["noscript", "loading", "stale", "skip_slowlog"],
        0,
        OPEN,
        "transactions",
        "Run the queued commands",
    ),
    spec(
        "discard",
        1,
        TX,
        0,
        OPEN,
        "transactions",
        "Forget the queued commands",
    ),
    spec(
        "watch",
        -2,
        TX,
        0,
        OPEN,
        "transactions",
        "Refused: transactions are not isolated",
    ),
    spec(
        "unwatch",
        1,
        TX,
        0,
        OPEN,
        "transactions",
        "No-op: nothing is watched",
    ),
];

/// CLIENT's subcommands, as COMMAND INFO lists them in CLIENT's entry (Redis's
/// `container|subcommand` names and arities).
static CLIENT_SUBCOMMANDS: &[Spec] = &[
    spec(
        "client|getname",
        2,
        C,
        0,
        OPEN,
        "connection",
        "The connection's name",
    ),
    spec(
        "client|help",
        2,
        C,
        0,
        OPEN,
        "connection",
        "CLIENT's subcommands",
    ),
    spec(
        "client|id",
        2,
        C,
        0,
        OPEN,
        "connection",
        "The connection's id",
    ),
    spec(
        "client|info",
        2,
        C,
        0,
        OPEN,
        "connection",
        "The connection as a CLIENT LIST line",
    ),
    spec(
        "client|kill",
        -3,
        &["admin", "noscript", "loading", "stale"],
        0,
        ADMIN | SENTINEL,
        "connection",
        "End other clients' connections",
    ),
    spec(
        "client|list",
        -2,
        &["admin", "noscript", "loading", "stale"],
        0,
        ADMIN | SENTINEL,
        "connection",
        "Every connection, one line each",
    ),
    spec(
        "client|setinfo",
        4,
        C,
        0,
        OPEN,
        "connection",
        "Name the client library",
    ),
    spec(
        "client|setname",
        3,
        C,
        0,
        OPEN,
        "connection",
        "Name the connection",
    ),
];

/// The subcommands COMMAND INFO lists in a command's entry (none for most).
pub fn subcommands(name: &str) -> &'static [Spec] {
    match name {
        "client" => CLIENT_SUBCOMMANDS,
        _ => &[],
    }
}

/// The position of a table entry in [`COMMANDS`] (an entry is always one of them).
pub fn index_of(spec: &'static Spec) -> usize {
    // Address arithmetic within one static slice: no search on every command.
    let offset = (spec as *const Spec as usize).wrapping_sub(COMMANDS.as_ptr() as usize);
    offset / std::mem::size_of::<Spec>().max(1)
}

/// The entry for a lower-cased command name.
pub fn lookup(name_lower: &str) -> Option<&'static Spec> {
    COMMANDS.iter().find(|s| s.name == name_lower)
}

/// The syntax of a command that takes arguments, as its syntax error shows it (`name`:
/// the lower-case command, or `command|subcommand`). `None` for one without arguments.
pub fn usage(name: &str) -> Option<&'static str> {
    Some(match name {
        "reserve" => "RESERVE <sku> <user> <admission-token> <request-id> [QTY n] [WITHLIMIT]",
        "stock" => "STOCK <sku>",
        "reservation" => "RESERVATION <token>",
        "extend" => "EXTEND <token> <ms>",
        "commit" => "COMMIT <token> [VERIFIED]",
        "release" => "RELEASE <token> [REASON cancel|expired|admin|rebuild]",
        "expired" => "EXPIRED [COUNT n] [SKU sku]",
        "sale.create" => "SALE.CREATE <sku> <total> [SHARDS n] [TTL ms] [LIMIT units-per-user]",
        "sale.info" => "SALE.INFO <sku>",
        "sale.pause" => "SALE.PAUSE <sku>",
        "sale.resume" => "SALE.RESUME <sku>",
        "sale.adjust" => "SALE.ADJUST <sku> <delta>",
        "sale.fence" => "SALE.FENCE <sku> [TOTAL n] [SHARDS n] [TTL ms] [LIMIT n]",
        "sale.restore" => "SALE.RESTORE <sku> <user> <request-id> <qty> <expires_at_ms> <created_at_ms> [STATE RESERVED|COMMITTED|RELEASED]",
        "sale.rebuild" => "SALE.REBUILD <sku> <total> <committed> <key-fingerprint>",
        "room.open" => "ROOM.OPEN <sku> [OPENS-AT ms] [RATE n] [OVERADMIT permille] [ADMIT-TTL ms] [WINDOW ms] [MAX n]",
        "room.join" => "ROOM.JOIN <sku> <user>",
        "room.status" => "ROOM.STATUS <sku> <user> <ticket>",
        "room.leave" => "ROOM.LEAVE <sku> <user>",
        "room.info" => "ROOM.INFO <sku>",
        "auth" => "AUTH [username] <password>",
        "hello" => "HELLO [protover [AUTH username password] [SETNAME clientname]]",
        "client|kill" => "CLIENT KILL <ip:port> | CLIENT KILL [ID id] [TYPE normal|pubsub|replica|master] [USER username] [ADDR ip:port] [SKIPME yes|no]",
        "cluster|setslot" => "CLUSTER SETSLOT <slot> IMPORTING|MIGRATING|NODE <node-id> | STABLE",
        "shutdown" => "SHUTDOWN [NOSAVE|SAVE]",
        "xread" => "XREAD [COUNT n] [BLOCK ms] STREAMS <key> [key ...] <id> [id ...]",
        "xrange" => "XRANGE <key> <start> <end> [COUNT n]",
        "xrevrange" => "XREVRANGE <key> <end> <start> [COUNT n]",
        "xlen" => "XLEN <key>",
        "xinfo" => "XINFO STREAM <key> | XINFO GROUPS <key> | XINFO CONSUMERS <key> <group> | XINFO HELP",
        "xack" => "XACK <key> <group> <id> [id ...]",
        "xgroup" => "XGROUP CREATE <key> <group> <id|$> [MKSTREAM] [ENTRIESREAD n] | XGROUP SETID <key> <group> <id|$> [ENTRIESREAD n] | XGROUP DESTROY <key> <group> | XGROUP CREATECONSUMER|DELCONSUMER <key> <group> <consumer>",
        "xreadgroup" => "XREADGROUP GROUP <group> <consumer> [COUNT n] [BLOCK ms] [NOACK] STREAMS <key> [key ...] <id> [id ...]",
        "xpending" => "XPENDING <key> <group> [[IDLE min-idle-time] <start> <end> <count> [consumer]]",
        "xclaim" => "XCLAIM <key> <group> <consumer> <min-idle-time> <id> [id ...] [IDLE ms] [TIME unix-time-ms] [RETRYCOUNT count] [FORCE] [JUSTID] [LASTID lastid]",
        "xautoclaim" => "XAUTOCLAIM <key> <group> <consumer> <min-idle-time> <start> [COUNT count] [JUSTID]",
        _ => return None,
    })
}

/// Whether `argc` arguments (the name included) fit the command's arity.
pub fn arity_ok(spec: &Spec, argc: usize) -> bool {
    let argc = argc as i64;
    if spec.arity >= 0 {
        argc == spec.arity
    } else {
        argc >= -spec.arity
    }
}

//! Connection commands: `AUTH`, `HELLO`, `CLIENT`, `PING`, `SELECT`, `RESET`.

use super::args::{int_in, syntax_error, ArgError, Args};
use super::{Ctx, Outcome};
use crate::protocol::reply::from_arg_error;
use crate::protocol::Reply;

/// `AUTH [user] password`
pub struct Auth<'a> {
    user: &'a [u8],
    pass: &'a [u8],
}

impl<'a> Auth<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        match args {
            [pass] => Ok(Auth {
                user: b"default",
                pass,
            }),
            [user, pass] => Ok(Auth { user, pass }),
            _ => Err(syntax_error("auth")),
        }
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        authenticate(ctx, self.user, self.pass)
            .unwrap_or_else(|e| e)
            .into()
    }
}

fn authenticate(ctx: &mut Ctx<'_>, user: &[u8], pass: &[u8]) -> Result<Reply, Reply> {
    let Some(users) = ctx.shared.users.as_ref() else {
        return Err(Reply::err(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        ));
    };
    match users.check(user, pass) {
        Some(role) => {
            ctx.conn.role = Some(role);
            let name = String::from_utf8_lossy(user).into_owned();
            ctx.shared.clients.set_user(ctx.conn.id, Some(name.clone()));
            ctx.conn.user_name = Some(name);
            Ok(Reply::ok())
        }
        None => {
            ctx.shared
                .stats
                .auth_failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(Reply::err(
                "WRONGPASS invalid username-password pair or user is disabled.",
            ))
        }
    }
}

/// `HELLO [protover [AUTH user pass] [SETNAME name]]`
pub struct Hello<'a> {
    proto: Option<u8>,
    auth: Option<(&'a [u8], &'a [u8])>,
    name: Option<&'a str>,
}

impl<'a> Hello<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("hello", args);
        let mut h = Hello {
            proto: None,
            auth: None,
            name: None,
        };
        if a.remaining() == 0 {
            return Ok(h);
        }
        // An integer other than 2 or 3 is NOPROTO (clients fall back to RESP2 on it);
        // anything else is no protocol version at all.
        h.proto = Some(match int_in(a.next_bytes()?, "protocol version", 2, 3) {
            Ok(v) => v as u8,
            Err(ArgError::OutOfRange { .. }) => 0,
            Err(e) => return Err(from_arg_error(&e)),
        });
        while a.remaining() > 0 {
            match a.next_keyword()?.as_str() {
                "AUTH" => {
                    let u = a.next_bytes()?;
                    let p = a.next_bytes()?;
                    h.auth = Some((u, p));
                }
                "SETNAME" => h.name = Some(a.next_str("name")?),
                _ => return Err(a.syntax()),
            }
        }
        Ok(h)
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let proto = match self.proto {
            None => ctx.conn.proto,
            Some(p @ (2 | 3)) => p,
            Some(_) => {
                return Reply::err(
                    "NOPROTO unsupported protocol version: stockgate speaks RESP 2 and 3",
                )
                .into()
            }
        };
        if let Some((u, p)) = self.auth {
            if let Err(e) = authenticate(ctx, u, p) {
                return e.into();
            }
        } else if ctx.shared.users.is_some() && ctx.conn.role.is_none() {
            return Reply::err("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time").into();
        }
        if let Some(n) = self.name {
            if let Err(e) = set_name(ctx, n) {
                return e.into();
            }
        }
        ctx.conn.proto = proto;
        Reply::map([
            ("server", Reply::bulk("stockgate")),
            ("version", Reply::bulk(env!("CARGO_PKG_VERSION"))),
            ("proto", Reply::Int(proto as i64)),
            ("id", Reply::Int(ctx.conn.id as i64)),
            ("mode", Reply::bulk("standalone")),
            ("role", Reply::bulk("master")),
            ("modules", Reply::Array(vec![])),
        ])
        .into()
    }
}

fn set_name(ctx: &mut Ctx<'_>, name: &str) -> Result<(), Reply> {
    if name.bytes().any(|b| !(0x21..=0x7e).contains(&b)) {
        return Err(Reply::err(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    ctx.conn.name = (!name.is_empty()).then(|| name.chars().take(256).collect());
    Ok(())
}

/// `PING [message]`: PONG, or the message; in subscriber mode Redis's array shape.
pub fn ping(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    let _ = ctx;
    match args {
        [] => Reply::Simple("PONG").into(),
        [msg] => Reply::Bulk(msg.to_vec()).into(),
        _ => Reply::arity("ping").into(),
    }
}

/// `CLIENT KILL <filter value> ...` with TYPE normal|pubsub|replica|slave|master, ID n,
/// ADDR ip:port, USER name and SKIPME yes|no (default yes, as Redis). Answers how many were killed.
/// Sentinel sends `CLIENT KILL TYPE normal` and `... TYPE pubsub` to a node it
/// reconfigures, so the clients reconnect to the right primary.
fn client_kill(ctx: &mut Ctx<'_>, filters: &[&[u8]]) -> Outcome {
    use crate::pubsub::{KillFilter, KIND_NORMAL, KIND_PUBSUB, KIND_REPLICA};
    let mut which = Vec::new();
    let mut skipme = true;
    for pair in filters.chunks(2) {
        let key = String::from_utf8_lossy(pair[0]).to_ascii_lowercase();
        let val = String::from_utf8_lossy(pair[1]).to_ascii_lowercase();
        let f = match key.as_str() {
            "type" => match val.as_str() {
                "normal" => KillFilter::Type(KIND_NORMAL),
                "pubsub" => KillFilter::Type(KIND_PUBSUB),
                "replica" | "slave" => KillFilter::Type(KIND_REPLICA),
                // This node's own link to its primary is not a client connection.
                "master" => continue,
                _ => return Reply::err(format!("ERR Unknown client type '{val}'")).into(),
            },
            "id" => match val.parse() {
                Ok(id) => KillFilter::Id(id),
                Err(_) => return Reply::err("ERR client-id should be greater than 0").into(),
            },
            "addr" => KillFilter::Addr(String::from_utf8_lossy(pair[1]).into_owned()),
            "user" => KillFilter::User(String::from_utf8_lossy(pair[1]).into_owned()),
            "skipme" => {
                skipme = match val.as_str() {
                    "yes" => true,
                    "no" => false,
                    _ => return syntax_error("client|kill").into(),
                };
                continue;
            }
            _ => return syntax_error("client|kill").into(),
        };
        which.push(f);
    }
    let me = skipme.then_some(ctx.conn.id);
    let n: usize = which.iter().map(|f| ctx.shared.clients.kill(f, me)).sum();
    Reply::Int(n as i64).into()
}

/// `SELECT 0` only: there is one database.
pub fn select(args: &[&[u8]]) -> Outcome {
    if args[0] == b"0" {
        Reply::ok().into()
    } else {
        Reply::err("ERR DB index is out of range").into()
    }
}

/// `RESET`: the connection back to its state after connecting (RESP2, no user, no name).
pub fn reset(ctx: &mut Ctx<'_>) -> Outcome {
    // As Redis: RESET also discards an open transaction.
    ctx.conn.multi = None;
    ctx.conn.proto = 2;
    ctx.conn.name = None;
    if ctx.shared.users.is_some() {
        ctx.conn.role = None;
        ctx.conn.user_name = None;
        ctx.shared.clients.set_user(ctx.conn.id, None);
    }
    Reply::Simple("RESET").into()
}

/// `CLIENT HELP`: Redis's lines for the subcommands stockgate has.
const CLIENT_HELP: &[&str] = &[
    "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GETNAME",
    "    Return the name of the current connection.",
    "ID",
    "    Return the ID of the current connection.",
    "INFO",
    "    Return information about the current client connection.",
    "KILL <ip:port>",
    "    Kill connection made from <ip:port>.",
    "KILL <option> <value> [<option> <value> [...]]",
    "    Kill connections. Options are:",
    "    * ADDR <ip:port>",
    "      Kill connections made from the specified address",
    "    * TYPE (NORMAL|MASTER|REPLICA|PUBSUB)",
    "      Kill connections by type.",
    "    * USER <username>",
    "      Kill connections authenticated by <username>.",
    "    * SKIPME (YES|NO)",
    "      Skip killing current connection (default: yes).",
    "    * ID <client-id>",
    "      Kill connections by client id.",
    "LIST",
    "    Return information about client connections.",
    "SETINFO <option> <value>",
    "    Set client meta attr. Options are:",
    "    * LIB-NAME: the client lib name.",
    "    * LIB-VER: the client lib version.",
    "SETNAME <name>",
    "    Assign the name <name> to the current connection.",
    "HELP",
    "    Print this help.",
];

/// The subcommands that reach other clients' sessions: `KILL` ends them, `LIST` shows
/// their addresses and users. For admins and Sentinel only; the rest of CLIENT is open to
/// every role.
fn client_refusal(ctx: &Ctx<'_>, sub: &str) -> Option<Reply> {
    use crate::session::Role;
    let reaches_others = matches!(sub, "KILL" | "LIST");
    if !reaches_others || matches!(ctx.conn.role, Some(Role::Admin | Role::Sentinel)) {
        return None;
    }
    let user = ctx.conn.user_name.clone().unwrap_or_default();
    Some(Reply::err(format!(
        "NOPERM User {user} has no permissions to run the 'client|{}' command",
        sub.to_ascii_lowercase()
    )))
}

/// `CLIENT LIST` (and `CLIENT INFO`, this connection's line): Redis's line format.
fn client_list(ctx: &Ctx<'_>, only: Option<u64>) -> Reply {
    let name = |i: usize| {
        super::command_table::COMMANDS
            .get(i)
            .map_or("NULL", |s| s.name)
    };
    let text = ctx.shared.clients.list(only, name);
    if only.is_some() && text.is_empty() {
        // Not registered (an embedded session): what the connection knows of itself.
        return Reply::bulk(format!("{}\n", ctx.conn.describe()));
    }
    Reply::bulk(text)
}

/// `CLIENT SETINFO LIB-NAME|LIB-VER value`
fn client_setinfo(ctx: &mut Ctx<'_>, attr: &[u8], value: &[u8]) -> Reply {
    let v: String = String::from_utf8_lossy(value).chars().take(128).collect();
    if v.contains([' ', '\n', '\r']) {
        return Reply::err(
            "ERR lib-name and lib-ver cannot contain spaces, newlines or special characters.",
        );
    }
    match String::from_utf8_lossy(attr).to_ascii_uppercase().as_str() {
        "LIB-NAME" => ctx.conn.lib_name = v,
        "LIB-VER" => ctx.conn.lib_ver = v,
        other => return Reply::err(format!("ERR Unrecognized option '{other}'")),
    }
    Reply::ok()
}

/// `CLIENT SETNAME|GETNAME|ID|SETINFO|INFO|LIST|KILL|HELP`
pub fn client(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    let sub = String::from_utf8_lossy(args[0]).to_ascii_uppercase();
    let rest = &args[1..];
    if let Some(refusal) = client_refusal(ctx, &sub) {
        return refusal.into();
    }
    let reply = match (sub.as_str(), rest) {
        ("SETNAME", [name]) => match std::str::from_utf8(name) {
            Ok(n) => set_name(ctx, n).map_or_else(|e| e, |()| Reply::ok()),
            Err(_) => Reply::err(
                "ERR Client names cannot contain spaces, newlines or special characters.",
            ),
        },
        ("GETNAME", []) => ctx.conn.name.as_ref().map_or(Reply::Nil, Reply::bulk),
        ("ID", []) => Reply::Int(ctx.conn.id as i64),
        ("SETINFO", [attr, value]) => client_setinfo(ctx, attr, value),
        ("INFO", []) => client_list(ctx, Some(ctx.conn.id)),
        ("LIST", []) => client_list(ctx, None),
        ("HELP", []) => Reply::Array(CLIENT_HELP.iter().map(|l| Reply::Simple(l)).collect()),
        ("KILL", [addr]) => {
            // The old form: one client by address; an error if there is none.
            let f = crate::pubsub::KillFilter::Addr(String::from_utf8_lossy(addr).into_owned());
            match ctx.shared.clients.kill(&f, None) {
                0 => Reply::err("ERR No such client"),
                _ => Reply::ok(),
            }
        }
        ("KILL", filters) if !filters.is_empty() && filters.len() % 2 == 0 => {
            return client_kill(ctx, filters)
        }
        _ => {
            let shown: String = sub.chars().take(64).collect();
            Reply::err(format!(
                "ERR unknown subcommand or wrong number of arguments for '{shown}'. Try CLIENT HELP."
            ))
        }
    };
    // CLIENT LIST shows the name and library as they are now.
    ctx.conn.show();
    reply.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, error_text, syntax};

    #[test]
    fn auth_takes_a_password_or_a_user_and_a_password() {
        let one = argv(&["pw"]);
        let a = Auth::parse(&one).unwrap();
        assert_eq!((a.user, a.pass), (&b"default"[..], &b"pw"[..]));
        let two = argv(&["u", "pw"]);
        let a = Auth::parse(&two).unwrap();
        assert_eq!((a.user, a.pass), (&b"u"[..], &b"pw"[..]));
        assert_eq!(error_text(Auth::parse(&argv(&[]))), syntax("auth"));
        assert_eq!(
            error_text(Auth::parse(&argv(&["a", "b", "c"]))),
            syntax("auth")
        );
    }

    #[test]
    fn hello_reads_its_options_in_any_order() {
        let none = argv(&[]);
        let h = Hello::parse(&none).unwrap();
        assert_eq!((h.proto, h.auth, h.name), (None, None, None));
        let words = argv(&["3", "SETNAME", "cart", "auth", "u", "pw"]);
        let h = Hello::parse(&words).unwrap();
        assert_eq!(h.proto, Some(3));
        assert_eq!(h.auth, Some((&b"u"[..], &b"pw"[..])));
        assert_eq!(h.name, Some("cart"));
    }

    #[test]
    fn hello_marks_an_unknown_version_noproto_and_refuses_the_rest() {
        // An integer out of 2..=3 parses (the reply is NOPROTO, which clients fall back on).
        let four = argv(&["4"]);
        assert_eq!(Hello::parse(&four).unwrap().proto, Some(0));
        let not_a_number = error_text(Hello::parse(&argv(&["three"])));
        assert!(not_a_number.contains("protocol version"), "{not_a_number}");
        assert_eq!(
            error_text(Hello::parse(&argv(&["3", "FAST"]))),
            syntax("hello")
        );
        let half_auth = error_text(Hello::parse(&argv(&["3", "AUTH", "u"])));
        assert!(half_auth.starts_with("ERR"), "{half_auth}");
    }
}

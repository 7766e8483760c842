//! `ACL WHOAMI | LIST | USERS | GETUSER | SETUSER | DELUSER | SAVE | LOAD | HELP`: the
//! users come from the users file (`crate::users`); `SETUSER` and `DELUSER` change the
//! users held, `SAVE` writes them to the file, `LOAD` reads it again.

use super::command_table::{Spec, COMMANDS};
use super::{Ctx, Outcome};
use crate::protocol::Reply;
use crate::users::{self, EditError, Role, User, UserEdit};

/// One `ACL` subcommand.
pub enum Acl {
    /// The connection's user (`default` without users).
    WhoAmI,
    /// Every user in Redis's ACL line shape, hashes only.
    List,
    /// The user names.
    Users,
    /// Reads the users file again; a bad file changes nothing.
    Load,
    /// One user in Redis's `ACL GETUSER` shape.
    GetUser(String),
    /// Creates or changes a user.
    SetUser(String, UserEdit),
    /// Removes users.
    DelUser(Vec<String>),
    /// Writes the users held to the users file.
    Save,
    /// The subcommands, one line each.
    Help,
}

impl Acl {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &[&[u8]]) -> Result<Acl, Reply> {
        let sub = String::from_utf8_lossy(args[0]).to_ascii_uppercase();
        match (sub.as_str(), args.len()) {
            ("WHOAMI", 1) => Ok(Acl::WhoAmI),
            ("LIST", 1) => Ok(Acl::List),
            ("USERS", 1) => Ok(Acl::Users),
            ("LOAD", 1) => Ok(Acl::Load),
            ("HELP", 1) => Ok(Acl::Help),
            ("SAVE", 1) => Ok(Acl::Save),
            ("GETUSER", 2) => Ok(Acl::GetUser(user_name("GETUSER", args[1])?)),
            ("SETUSER", n) if n >= 2 => {
                let name = user_name("SETUSER", args[1])?;
                let edit = parse_rules(&args[2..])
                    .map_err(|why| Reply::err(format!("ERR ACL SETUSER: {why}")))?;
                Ok(Acl::SetUser(name, edit))
            }
            ("DELUSER", n) if n >= 2 => args[1..]
                .iter()
                .map(|a| user_name("DELUSER", a))
                .collect::<Result<_, _>>()
                .map(Acl::DelUser),
            ("GENPASS" | "CAT" | "LOG" | "DRYRUN", _) => Err(Reply::err(format!(
                "ERR ACL {sub} is not supported: a user has one of five roles, not Redis's per-command rules"
            ))),
            _ => {
                let shown: String = String::from_utf8_lossy(args[0]).chars().take(64).collect();
                Err(Reply::err(format!(
                    "ERR unknown subcommand or wrong number of arguments for '{shown}'. Try ACL HELP."
                )))
            }
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Acl::WhoAmI => "whoami",
            Acl::List => "list",
            Acl::Users => "users",
            Acl::Load => "load",
            Acl::Help => "help",
            Acl::GetUser(_) => "getuser",
            Acl::SetUser(..) => "setuser",
            Acl::DelUser(_) => "deluser",
            Acl::Save => "save",
        }
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let admin_only = !matches!(self, Acl::WhoAmI | Acl::Help);
        if admin_only && ctx.conn.role != Some(Role::Admin) {
            let user = ctx.conn.user_name.as_deref().unwrap_or("default");
            return Reply::err(format!(
                "NOPERM User {user} has no permissions to run the 'acl|{}' command",
                self.name()
            ))
            .into();
        }
        match self {
            Acl::WhoAmI => Reply::bulk(ctx.conn.user_name.as_deref().unwrap_or("default")),
            Acl::List => list(ctx),
            Acl::Users => users(ctx),
            Acl::Load => load(ctx),
            Acl::GetUser(name) => get_user(ctx, &name),
            Acl::SetUser(name, edit) => set_user(ctx, &name, &edit),
            Acl::DelUser(names) => del_users(ctx, &names),
            Acl::Save => save(ctx),
            Acl::Help => Reply::Array(HELP.iter().map(|l| Reply::Simple(l)).collect()),
        }
        .into()
    }
}

/// The `ACL HELP` lines.
const HELP: &[&str] = &[
    "ACL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "WHOAMI",
    "    Return the current connection username.",
    "LIST",
    "    Show users and their rules (password hashes, never passwords).",
    "USERS",
    "    List all the registered usernames.",
    "GETUSER <username>",
    "    Get the user's flags, password hash and rules.",
    "SETUSER <username> [rule ...]",
    "    Create or change a user. Rules: >password, #<sha256 hex>, resetpass, +@<role>",
    "    (admin, checkout, sweeper, replication, sentinel; +@all is admin), on; ~* &*",
    "    allkeys allchannels are accepted and change nothing. A new user needs a password",
    "    and a role; a change keeps what it does not name. Logged-in connections keep",
    "    their role.",
    "DELUSER <username> [<username> ...]",
    "    Delete users (never the last admin). Logged-in connections stay.",
    "SAVE",
    "    Write the users to the users file (hashes only).",
    "LOAD",
    "    Reload users from the users file, dropping changes not saved.",
    "HELP",
    "    Print this help.",
];

/// A user name from the wire: UTF-8 (the users file is text).
fn user_name(sub: &str, arg: &[u8]) -> Result<String, Reply> {
    String::from_utf8(arg.to_vec()).map_err(|_| refusal(sub, EditError::Name))
}

fn refusal(sub: &str, e: EditError) -> Reply {
    Reply::err(format!("ERR ACL {sub}: {e}"))
}

/// The rules `ACL SETUSER` reads, in order. A refusal never repeats a password.
fn parse_rules(rules: &[&[u8]]) -> Result<UserEdit, String> {
    let mut edit = UserEdit::default();
    let mut reset = false;
    for rule in rules {
        let word = String::from_utf8_lossy(rule).to_ascii_lowercase();
        match word.as_str() {
            "on" | "~*" | "&*" | "allkeys" | "allchannels" => {}
            "off" => return Err("the rule 'off' is not supported: a user cannot be disabled; delete it (ACL DELUSER) or change its password".into()),
            "nopass" => return Err("the rule 'nopass' is refused: a user always has a password".into()),
            "resetpass" => {
                edit.digest = None;
                reset = true;
            }
            _ => match rule.first() {
                Some(b'>') => set_password(&mut edit, users::digest(&rule[1..]), rule.len() == 1)?,
                Some(b'#') => {
                    let d = std::str::from_utf8(rule).ok().and_then(users::parse_hash).ok_or(
                        "a '#' rule must be '#' and the 64 hex digits of the password's SHA-256",
                    )?;
                    set_password(&mut edit, d, false)?;
                }
                Some(b'<' | b'!') => return Err("removing one password ('<' or '!') is not supported: a user has exactly one password; set another with '>password'".into()),
                _ => edit.role = Some(role_rule(&word)?),
            },
        }
    }
    if reset && edit.digest.is_none() {
        return Err("'resetpass' would leave the user without a password: follow it with '>password' or '#<sha256 hex>'".into());
    }
    Ok(edit)
}

fn set_password(edit: &mut UserEdit, digest: [u8; 32], empty: bool) -> Result<(), String> {
    if empty {
        return Err("an empty password is refused".into());
    }
    if edit.digest.is_some() {
        return Err("a user has one password: give one '>password' or '#<sha256 hex>'".into());
    }
    edit.digest = Some(digest);
    Ok(())
}

/// `+@<role>` (`+@all` is admin, as `ACL LIST` prints it); any other rule is refused by name.
fn role_rule(word: &str) -> Result<Role, String> {
    const ROLES: &str = "+@admin (or +@all), +@checkout, +@sweeper, +@replication, +@sentinel";
    let shown: String = word.chars().take(64).collect();
    let Some(role) = word.strip_prefix("+@") else {
        return Err(format!(
            "the rule '{shown}' is not supported: a user has one role ({ROLES}), no per-command, key or channel rules"
        ));
    };
    match role {
        "all" => Ok(Role::Admin),
        r => Role::parse(r).ok_or(format!("'{shown}' names no role: the roles are {ROLES}")),
    }
}

/// Redis's ACL rules for what a role may run: `+@all` for admin, otherwise the commands
/// of the command table open to the role, and the subcommands it is refused.
pub fn role_rules(role: Role) -> String {
    if role == Role::Admin {
        return "+@all".into();
    }
    let mut rules = vec!["-@all".to_string()];
    rules.extend(
        COMMANDS
            .iter()
            .filter(|s: &&Spec| s.roles & role.bit() != 0)
            .map(|s| format!("+{}", s.name)),
    );
    if role != Role::Sentinel {
        rules.push("-client|kill".into());
        rules.push("-sentinel|failover".into());
    }
    for admin_sub in [
        "-acl|list",
        "-acl|users",
        "-acl|getuser",
        "-acl|setuser",
        "-acl|deluser",
        "-acl|save",
        "-acl|load",
    ] {
        rules.push(admin_sub.into());
    }
    rules.join(" ")
}

/// One `ACL LIST` line: a hash, never a password.
fn list_line(u: &User) -> String {
    format!(
        "user {} on #{} ~* &* {}",
        u.name,
        u.digest_hex(),
        role_rules(u.role)
    )
}

fn list(ctx: &Ctx<'_>) -> Reply {
    let Some(db) = &ctx.shared.users else {
        return Reply::Array(vec![Reply::bulk("user default on nopass ~* &* +@all")]);
    };
    Reply::Array(
        db.snapshot()
            .iter()
            .map(|u| Reply::bulk(list_line(u)))
            .collect(),
    )
}

fn users(ctx: &Ctx<'_>) -> Reply {
    let Some(db) = &ctx.shared.users else {
        return Reply::Array(vec![Reply::bulk("default")]);
    };
    Reply::Array(
        db.snapshot()
            .iter()
            .map(|u| Reply::bulk(u.name.clone()))
            .collect(),
    )
}

fn load(ctx: &Ctx<'_>) -> Reply {
    let Some(db) = ctx.shared.users.as_ref().filter(|db| db.file().is_some()) else {
        return Reply::err(
            "ERR ACL LOAD: the server was started without --users-file; there is no file to load",
        );
    };
    match db.reload() {
        Ok(n) => {
            tracing::info!(users = n, "ACL LOAD: users file read again");
            Reply::ok()
        }
        Err(e) => {
            tracing::warn!("ACL LOAD refused: {e}");
            Reply::err(format!("ERR ACL LOAD: {e}; the users held are unchanged"))
        }
    }
}

/// The users the server holds, or the refusal of an edit on a server without users.
fn user_db<'a>(ctx: &'a Ctx<'_>, sub: &str) -> Result<&'a users::UserDb, Reply> {
    ctx.shared.users.as_ref().ok_or_else(|| {
        Reply::err(format!(
            "ERR ACL {sub}: the server runs without users (no --users-file or --requirepass); start it with --users-file to manage users"
        ))
    })
}

fn get_user(ctx: &Ctx<'_>, name: &str) -> Reply {
    let Some(db) = &ctx.shared.users else {
        return match name {
            "default" => user_reply(&["on", "nopass"], Vec::new(), "+@all"),
            _ => Reply::Nil,
        };
    };
    match db.snapshot().iter().find(|u| u.name == name) {
        Some(u) => user_reply(
            &["on"],
            vec![Reply::bulk(u.digest_hex())],
            &role_rules(u.role),
        ),
        None => Reply::Nil,
    }
}

/// Redis 7's `ACL GETUSER` fields.
fn user_reply(flags: &[&'static str], passwords: Vec<Reply>, commands: &str) -> Reply {
    Reply::Map(vec![
        (
            Reply::StaticBulk("flags"),
            Reply::Array(flags.iter().map(|f| Reply::StaticBulk(f)).collect()),
        ),
        (Reply::StaticBulk("passwords"), Reply::Array(passwords)),
        (Reply::StaticBulk("commands"), Reply::bulk(commands)),
        (Reply::StaticBulk("keys"), Reply::StaticBulk("~*")),
        (Reply::StaticBulk("channels"), Reply::StaticBulk("&*")),
        (Reply::StaticBulk("selectors"), Reply::Array(Vec::new())),
    ])
}

fn set_user(ctx: &Ctx<'_>, name: &str, edit: &UserEdit) -> Reply {
    let db = match user_db(ctx, "SETUSER") {
        Ok(db) => db,
        Err(r) => return r,
    };
    match db.set_user(name, edit) {
        Ok(()) => {
            tracing::info!(user = name, "ACL SETUSER: user set");
            Reply::ok()
        }
        Err(e) => refusal("SETUSER", e),
    }
}

fn del_users(ctx: &Ctx<'_>, names: &[String]) -> Reply {
    let db = match user_db(ctx, "DELUSER") {
        Ok(db) => db,
        Err(r) => return r,
    };
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    match db.delete_users(&names) {
        Ok(n) => {
            // As Redis: a deleted user's sessions end (this one excepted, so it gets its
            // reply).
            let closed: usize = names
                .iter()
                .map(|u| {
                    let f = crate::pubsub::KillFilter::User((*u).to_string());
                    ctx.shared.clients.kill(&f, Some(ctx.conn.id))
                })
                .sum();
            tracing::info!(deleted = n, closed, "ACL DELUSER: users deleted");
            Reply::Int(n as i64)
        }
        Err(e) => refusal("DELUSER", e),
    }
}

fn save(ctx: &Ctx<'_>) -> Reply {
    let Some(db) = &ctx.shared.users else {
        return refusal("SAVE", EditError::NoFile);
    };
    match db.save() {
        Ok(n) => {
            tracing::info!(users = n, "ACL SAVE: users file written");
            Reply::ok()
        }
        Err(e) => {
            tracing::warn!("ACL SAVE refused: {e}");
            refusal("SAVE", e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, error_text};

    #[test]
    fn subcommands() {
        assert!(matches!(Acl::parse(&argv(&["whoami"])), Ok(Acl::WhoAmI)));
        assert!(matches!(Acl::parse(&argv(&["LIST"])), Ok(Acl::List)));
        assert!(matches!(Acl::parse(&argv(&["Load"])), Ok(Acl::Load)));
        let e = error_text(Acl::parse(&argv(&["CAT"])));
        assert!(e.contains("five roles"), "{e}");
        let e = error_text(Acl::parse(&argv(&["LIST", "extra"])));
        assert!(e.contains("Try ACL HELP"), "{e}");
    }

    #[test]
    fn rules_follow_the_command_table() {
        assert_eq!(role_rules(Role::Admin), "+@all");
        let r = role_rules(Role::Checkout);
        assert!(r.starts_with("-@all "), "{r}");
        assert!(r.contains(" +reserve "), "{r}");
        assert!(!r.contains("+sale.create"), "{r}");
        assert!(r.contains("-client|kill"), "{r}");
    }

    fn rules(words: &[&str]) -> Result<UserEdit, String> {
        parse_rules(&argv(words))
    }

    #[test]
    fn setuser_rules() {
        let e = rules(&[
            "on",
            ">pw",
            "+@checkout",
            "~*",
            "&*",
            "allkeys",
            "allchannels",
        ])
        .unwrap();
        assert_eq!(e.digest, Some(users::digest(b"pw")));
        assert_eq!(e.role, Some(Role::Checkout));
        assert_eq!(rules(&["+@all"]).unwrap().role, Some(Role::Admin));
        assert_eq!(rules(&["+@SWEEPER"]).unwrap().role, Some(Role::Sweeper));
        let hash = format!("#{}", "AB".repeat(32));
        assert_eq!(rules(&[&hash]).unwrap().digest, Some([0xab; 32]));
        assert_eq!(
            rules(&["resetpass", ">new"]).unwrap().digest,
            Some(users::digest(b"new"))
        );
        assert_eq!(rules(&[]).unwrap(), UserEdit::default());
    }

    #[test]
    fn setuser_refusals_name_the_rule_never_the_password() {
        for (words, want) in [
            (&["off"][..], "'off' is not supported"),
            (&["nopass"], "'nopass' is refused"),
            (&["+get"], "the rule '+get' is not supported"),
            (&["~cart:*"], "the rule '~cart:*' is not supported"),
            (&["+@root"], "'+@root' names no role"),
            (&["#abc"], "64 hex digits"),
            (&[">"], "empty password"),
            (&[">a", ">b"], "one password"),
            (&[">secret", "resetpass"], "without a password"),
            (&["<secret"], "not supported"),
        ] {
            let e = rules(words).unwrap_err();
            assert!(e.contains(want), "{words:?}: {e}");
            assert!(!e.contains("secret"), "{words:?}: {e}");
        }
        let e = error_text(Acl::parse(&argv(&["SETUSER", "u", "nopass"])));
        assert!(e.starts_with("ERR ACL SETUSER: "), "{e}");
        assert!(
            matches!(Acl::parse(&argv(&["DELUSER", "a", "b"])), Ok(Acl::DelUser(v)) if v.len() == 2)
        );
        assert!(matches!(Acl::parse(&argv(&["save"])), Ok(Acl::Save)));
        let e = error_text(Acl::parse(&argv(&["DELUSER"])));
        assert!(e.contains("Try ACL HELP"), "{e}");
    }
}

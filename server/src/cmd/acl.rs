//! `ACL WHOAMI | LIST | USERS | LOAD | HELP`: the users come from the users file
//! (`crate::users`); `ACL LOAD` reads it again. Users are not edited over the wire.

use super::command_table::{Spec, COMMANDS};
use super::{Ctx, Outcome};
use crate::protocol::Reply;
use crate::users::{Role, User};

pub enum Acl {
    WhoAmI,
    List,
    Users,
    Load,
    Help,
}

impl Acl {
    pub fn parse(args: &[&[u8]]) -> Result<Acl, Reply> {
        let sub = String::from_utf8_lossy(args[0]).to_ascii_uppercase();
        match (sub.as_str(), args.len()) {
            ("WHOAMI", 1) => Ok(Acl::WhoAmI),
            ("LIST", 1) => Ok(Acl::List),
            ("USERS", 1) => Ok(Acl::Users),
            ("LOAD", 1) => Ok(Acl::Load),
            ("HELP", 1) => Ok(Acl::Help),
            ("SETUSER" | "DELUSER" | "SAVE" | "GETUSER" | "GENPASS" | "CAT" | "LOG"
            | "DRYRUN", _) => Err(Reply::err(format!(
                "ERR ACL {sub} is not supported: users come from the users file (--users-file); edit it and run ACL LOAD"
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
        }
    }

    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let admin_only = matches!(self, Acl::List | Acl::Users | Acl::Load);
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
            Acl::Help => Reply::Array(
                [
                    "ACL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                    "WHOAMI",
                    "    Return the current connection username.",
                    "LIST",
                    "    Show users and their rules (password hashes, never passwords).",
                    "USERS",
                    "    List all the registered usernames.",
                    "LOAD",
                    "    Reload users from the users file.",
                    "HELP",
                    "    Print this help.",
                ]
                .iter()
                .map(|l| Reply::Simple(l))
                .collect(),
            ),
        }
        .into()
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
    for admin_sub in ["-acl|list", "-acl|users", "-acl|load"] {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, error_text};

    #[test]
    fn subcommands() {
        assert!(matches!(Acl::parse(&argv(&["whoami"])), Ok(Acl::WhoAmI)));
        assert!(matches!(Acl::parse(&argv(&["LIST"])), Ok(Acl::List)));
        assert!(matches!(Acl::parse(&argv(&["Load"])), Ok(Acl::Load)));
        let e = error_text(Acl::parse(&argv(&["SETUSER", "x", "on"])));
        assert!(e.contains("users come from the users file"), "{e}");
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
}

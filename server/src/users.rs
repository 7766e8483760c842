//! Users and roles: the users file, the password check, and the set of users the running
//! server holds (replaced whole by `ACL LOAD`).
//!
//! A password field is either the password itself or, as Redis ACL writes it, `#` and the
//! 64 hex digits of its SHA-256 (`printf %s 'pw' | sha256sum`). Either way only the digest
//! is kept, and compared in constant time, so neither a timing side channel nor a memory
//! dump gives a password away.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;
use sha2::{Digest, Sha256};

/// Role bits, as the command table (`cmd::command_table`) stores who may run a command.
pub const CHECKOUT: u8 = 1;
pub const SWEEPER: u8 = 2;
pub const ADMIN: u8 = 4;
/// Monitoring of replication (INFO, ROLE); users files from the Redis-style replication
/// that name it still load.
pub const REPLICATION: u8 = 8;
/// What Redis Sentinel and Sentinel-aware tools send (INFO, ROLE, SENTINEL, CONFIG
/// REWRITE, CLIENT KILL, PUBLISH/SUBSCRIBE, MULTI/EXEC).
pub const SENTINEL: u8 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Admin,
    Checkout,
    Sweeper,
    Replication,
    Sentinel,
}

impl Role {
    pub fn bit(self) -> u8 {
        match self {
            Role::Admin => ADMIN,
            Role::Checkout => CHECKOUT,
            Role::Sweeper => SWEEPER,
            Role::Replication => REPLICATION,
            Role::Sentinel => SENTINEL,
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "checkout" => Some(Role::Checkout),
            "sweeper" => Some(Role::Sweeper),
            "replication" => Some(Role::Replication),
            "sentinel" => Some(Role::Sentinel),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Checkout => "checkout",
            Role::Sweeper => "sweeper",
            Role::Replication => "replication",
            Role::Sentinel => "sentinel",
        }
    }
}

/// Why a users file was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UsersError {
    #[error("users file line {line}: expected `<user> <role> <password>`")]
    Shape { line: usize },
    #[error(
        "users file line {line}: role must be admin, checkout, sweeper, replication or sentinel"
    )]
    Role { line: usize },
    #[error("users file line {line}: a password starting with `#` must be `#` and 64 hex digits (the SHA-256 of the password, `printf %s 'pw' | sha256sum`)")]
    Hash { line: usize },
    #[error("{path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path} lists no users: loading it would leave the server without passwords")]
    Empty { path: PathBuf },
}

/// One user: the name, the SHA-256 of the password, the role.
#[derive(Clone, Debug)]
pub struct User {
    pub name: String,
    pub digest: [u8; 32],
    pub role: Role,
}

impl User {
    /// The digest as `ACL LIST` shows it: 64 lowercase hex digits.
    pub fn digest_hex(&self) -> String {
        self.digest.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A set of configured users.
#[derive(Clone, Debug, Default)]
pub struct Users {
    users: Vec<User>,
}

fn digest(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut d = 0u8;
    for i in 0..32 {
        d |= a[i] ^ b[i];
    }
    d == 0
}

/// `#<64 hex>` as the digest it names; `None` for anything else.
fn parse_hash(field: &str) -> Option<[u8; 32]> {
    let hex = field.strip_prefix('#')?.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// A password field: a hash (`#<64 hex>`) or the password itself.
fn password_digest(field: &str, line: usize) -> Result<[u8; 32], UsersError> {
    if field.starts_with('#') {
        return parse_hash(field).ok_or(UsersError::Hash { line });
    }
    Ok(digest(field.as_bytes()))
}

impl Users {
    /// Users file: one `<user> <role> <password>` per line; `#` comments.
    pub fn parse(text: &str) -> Result<Users, UsersError> {
        let mut users = Users::default();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut p = line.splitn(3, char::is_whitespace);
            let (Some(u), Some(r), Some(pw)) = (p.next(), p.next(), p.next()) else {
                return Err(UsersError::Shape { line: line_no });
            };
            let role = Role::parse(r).ok_or(UsersError::Role { line: line_no })?;
            let pw = pw.trim();
            if pw.is_empty() {
                return Err(UsersError::Shape { line: line_no });
            }
            users.users.push(User {
                name: u.to_string(),
                digest: password_digest(pw, line_no)?,
                role,
            });
        }
        Ok(users)
    }

    /// Reads and parses a users file.
    pub fn load(path: &Path) -> Result<Users, UsersError> {
        let text = std::fs::read_to_string(path).map_err(|e| UsersError::Read {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Users::parse(&text)
    }

    /// Adds a user with a plaintext password (`--requirepass`, tests).
    pub fn add(&mut self, user: &str, password: &str, role: Role) {
        self.users.push(User {
            name: user.to_string(),
            digest: digest(password.as_bytes()),
            role,
        });
    }

    pub fn empty() -> Users {
        Users::default()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &User> {
        self.users.iter()
    }

    pub fn check(&self, user: &[u8], pass: &[u8]) -> Option<Role> {
        let d = digest(pass);
        let mut found = None;
        // Look at every entry so the time taken does not say which user exists.
        for u in &self.users {
            let ok = ct_eq(&u.digest, &d);
            if u.name.as_bytes() == user && ok && found.is_none() {
                found = Some(u.role);
            }
        }
        found
    }
}

/// Where the users came from, so `ACL LOAD` can read them again.
#[derive(Clone, Debug, Default)]
pub struct UsersSource {
    /// `--users-file`.
    pub file: Option<PathBuf>,
    /// `--requirepass`: the `default` admin, added after the file's users.
    pub requirepass: Option<String>,
}

impl UsersSource {
    /// The users this source describes now.
    pub fn read(&self) -> Result<Users, UsersError> {
        let mut users = match &self.file {
            Some(p) => Users::load(p)?,
            None => Users::empty(),
        };
        if let Some(pw) = &self.requirepass {
            users.add("default", pw, Role::Admin);
        }
        Ok(users)
    }
}

/// The users the running server holds. A connection checks its password against the set
/// current at `AUTH` and keeps the role it got; `ACL LOAD` swaps in a new set for the next
/// `AUTH`.
pub struct UserDb {
    current: RwLock<Arc<Users>>,
    source: UsersSource,
}

impl UserDb {
    /// Users that cannot be reloaded (no file behind them).
    pub fn fixed(users: Users) -> UserDb {
        UserDb {
            current: RwLock::new(Arc::new(users)),
            source: UsersSource::default(),
        }
    }

    /// Users read from `source`, which `ACL LOAD` reads again.
    pub fn from_source(source: UsersSource) -> Result<UserDb, UsersError> {
        let users = source.read()?;
        Ok(UserDb {
            current: RwLock::new(Arc::new(users)),
            source,
        })
    }

    pub fn snapshot(&self) -> Arc<Users> {
        self.current.read().clone()
    }

    pub fn check(&self, user: &[u8], pass: &[u8]) -> Option<Role> {
        self.snapshot().check(user, pass)
    }

    /// The users file, if there is one.
    pub fn file(&self) -> Option<&Path> {
        self.source.file.as_deref()
    }

    /// `ACL LOAD`: reads the users file again and swaps it in; on any error the users held
    /// stay as they were. Returns how many users are now configured.
    pub fn reload(&self) -> Result<usize, UsersError> {
        let users = self.source.read()?;
        if users.is_empty() {
            return Err(UsersError::Empty {
                path: self.source.file.clone().unwrap_or_default(),
            });
        }
        let n = users.iter().count();
        *self.current.write() = Arc::new(users);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PW_HASH: &str = "#5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";

    #[test]
    fn plaintext_and_hashed_passwords() {
        // sha256("password") = 5e8848...
        let u = Users::parse(&format!(
            "# comment\nshop checkout s3cret\nboss admin {PW_HASH}\n"
        ))
        .unwrap();
        assert_eq!(u.check(b"shop", b"s3cret"), Some(Role::Checkout));
        assert_eq!(u.check(b"boss", b"password"), Some(Role::Admin));
        assert_eq!(
            u.check(b"boss", PW_HASH.as_bytes()),
            None,
            "the hash is no password"
        );
        assert_eq!(u.check(b"boss", b"s3cret"), None);
        assert_eq!(u.check(b"nobody", b"password"), None);
        let boss = u.iter().find(|x| x.name == "boss").unwrap();
        assert_eq!(format!("#{}", boss.digest_hex()), PW_HASH);
    }

    #[test]
    fn uppercase_hash_is_accepted() {
        let u = Users::parse(&format!("boss admin {}\n", PW_HASH.to_uppercase())).unwrap();
        assert_eq!(u.check(b"boss", b"password"), Some(Role::Admin));
    }

    #[test]
    fn refusals_name_the_line() {
        let cases: [(&str, UsersError); 4] = [
            ("\n\nboss admin\n", UsersError::Shape { line: 3 }),
            ("boss root pw\n", UsersError::Role { line: 1 }),
            ("# c\nboss admin #abc\n", UsersError::Hash { line: 2 }),
            (
                &format!("boss admin #{}\n", "g".repeat(64)),
                UsersError::Hash { line: 1 },
            ),
        ];
        for (text, want) in cases {
            assert_eq!(Users::parse(text).unwrap_err(), want, "{text:?}");
        }
        assert!(UsersError::Hash { line: 2 }
            .to_string()
            .starts_with("users file line 2: "));
    }

    #[test]
    fn reload_swaps_or_keeps() {
        let dir = std::env::temp_dir().join(format!("sg-users-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("users");
        std::fs::write(&f, "a admin pa\n").unwrap();
        let db = UserDb::from_source(UsersSource {
            file: Some(f.clone()),
            requirepass: Some("rp".into()),
        })
        .unwrap();
        assert_eq!(db.check(b"a", b"pa"), Some(Role::Admin));
        assert_eq!(db.check(b"default", b"rp"), Some(Role::Admin));
        std::fs::write(&f, "b checkout pb\n").unwrap();
        assert_eq!(db.reload(), Ok(2));
        assert_eq!(db.check(b"a", b"pa"), None);
        assert_eq!(db.check(b"b", b"pb"), Some(Role::Checkout));
        std::fs::write(&f, "c checkout pc\nbroken\n").unwrap();
        assert_eq!(db.reload(), Err(UsersError::Shape { line: 2 }));
        assert_eq!(
            db.check(b"b", b"pb"),
            Some(Role::Checkout),
            "old users stay"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reload_refuses_to_open_the_server() {
        let dir = std::env::temp_dir().join(format!("sg-users-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("users");
        std::fs::write(&f, "a admin pa\n").unwrap();
        let db = UserDb::from_source(UsersSource {
            file: Some(f.clone()),
            requirepass: None,
        })
        .unwrap();
        std::fs::write(&f, "# nobody\n").unwrap();
        assert!(matches!(db.reload(), Err(UsersError::Empty { .. })));
        assert_eq!(db.check(b"a", b"pa"), Some(Role::Admin));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

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
/// The checkout service: RESERVE, COMMIT, RELEASE, EXTEND and the reads a buyer needs.
pub const CHECKOUT: u8 = 1;
/// The sweeper: EXPIRED and the releases and commits that heal abandoned holds.
pub const SWEEPER: u8 = 2;
/// An operator: every command, sales and server settings included.
pub const ADMIN: u8 = 4;
/// Monitoring of replication (INFO, ROLE); users files from the Redis-style replication
/// that name it still load.
pub const REPLICATION: u8 = 8;
/// What Redis Sentinel and Sentinel-aware tools send (INFO, ROLE, SENTINEL, CONFIG
/// REWRITE, CLIENT KILL, PUBLISH/SUBSCRIBE, MULTI/EXEC).
pub const SENTINEL: u8 = 16;

/// What a user may do: each role is one bit of the command table's `roles`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// [`ADMIN`].
    Admin,
    /// [`CHECKOUT`].
    Checkout,
    /// [`SWEEPER`].
    Sweeper,
    /// [`REPLICATION`].
    Replication,
    /// [`SENTINEL`].
    Sentinel,
}

impl Role {
    /// The role's bit, as the command table tests it.
    pub fn bit(self) -> u8 {
        match self {
            Role::Admin => ADMIN,
            Role::Checkout => CHECKOUT,
            Role::Sweeper => SWEEPER,
            Role::Replication => REPLICATION,
            Role::Sentinel => SENTINEL,
        }
    }

    /// The role a users file names (`admin`, `checkout`, ...); `None` for another word.
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

    /// The word the users file and `ACL LIST` use.
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
// Each variant's `#[error]` text is its documentation.
#[allow(missing_docs)]
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
    /// The name AUTH gives.
    pub name: String,
    /// SHA-256 of the password: the password itself is never kept.
    pub digest: [u8; 32],
    /// What the user may run.
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

/// SHA-256 of a password, as the users hold it.
pub fn digest(b: &[u8]) -> [u8; 32] {
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
pub fn parse_hash(field: &str) -> Option<[u8; 32]> {
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

    /// No users: the server then asks for no password.
    pub fn empty() -> Users {
        Users::default()
    }

    /// True when no user is configured.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// The users in file order (`ACL LIST`, `ACL USERS`).
    pub fn iter(&self) -> impl Iterator<Item = &User> {
        self.users.iter()
    }

    /// The users file text of these users: hashes only, never a password.
    pub fn file_text(&self) -> String {
        let mut text = String::from(
            "# stockgate users file (ACL SAVE): <user> <role> #<sha256 of the password>\n",
        );
        for u in &self.users {
            text.push_str(&format!(
                "{} {} #{}\n",
                u.name,
                u.role.name(),
                u.digest_hex()
            ));
        }
        text
    }

    /// The role of `user` if `pass` is its password, comparing in constant time.
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

/// What `ACL SETUSER` changes; what is `None` stays as it was.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserEdit {
    /// The new password's digest.
    pub digest: Option<[u8; 32]>,
    /// The new role.
    pub role: Option<Role>,
}

/// Why a change to the users over the wire was refused.
// Each variant's `#[error]` text is its documentation.
#[allow(missing_docs)]
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EditError {
    #[error("a user name must be non-empty, without spaces or control characters, and must not start with `#` (the users file's comments)")]
    Name,
    #[error(
        "a new user needs a password (`>password` or `#<sha256 hex>`) and a role (`+@<role>`)"
    )]
    Incomplete,
    #[error("that would leave no admin user, and the server could no longer be managed")]
    LastAdmin,
    #[error("the user `default` comes from --requirepass; change the flag instead")]
    FlagUser,
    #[error("the server was started without --users-file; there is no file to save to")]
    NoFile,
    #[error("{path}: {message}")]
    Write { path: PathBuf, message: String },
}

/// A name the users file can hold on one line and read back as the same user.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('#')
        && !name.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn has_admin(users: &[User]) -> bool {
    users.iter().any(|u| u.role == Role::Admin)
}

/// `edit` applied to `name` in `users`: a change keeps what it does not name, a new user
/// needs both a password and a role.
fn apply_edit(users: &mut Vec<User>, name: &str, edit: &UserEdit) -> Result<(), EditError> {
    let Some(i) = users.iter().position(|u| u.name == name) else {
        let (Some(digest), Some(role)) = (edit.digest, edit.role) else {
            return Err(EditError::Incomplete);
        };
        users.push(User {
            name: name.to_string(),
            digest,
            role,
        });
        return Ok(());
    };
    let u = &mut users[i];
    u.digest = edit.digest.unwrap_or(u.digest);
    u.role = edit.role.unwrap_or(u.role);
    // A name the file lists twice (each of its passwords logs in) becomes one user with
    // one password, as SETUSER promises.
    let mut at = 0;
    users.retain(|u| {
        at += 1;
        at - 1 <= i || u.name != name
    });
    Ok(())
}

/// Writes `text` to `path` so that a crash leaves the old file or the new one: a temp file
/// beside it (the old file's mode, else 0600), fsync, rename, fsync of the directory.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.acl-save.tmp"));
    let mode = std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o777)
        .unwrap_or(0o600);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        // The umask does not narrow the mode the old file had.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
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
    saving: parking_lot::Mutex<()>,
}

impl UserDb {
    /// Users that cannot be reloaded (no file behind them).
    pub fn fixed(users: Users) -> UserDb {
        UserDb {
            current: RwLock::new(Arc::new(users)),
            source: UsersSource::default(),
            saving: parking_lot::Mutex::new(()),
        }
    }

    /// Users read from `source`, which `ACL LOAD` reads again.
    pub fn from_source(source: UsersSource) -> Result<UserDb, UsersError> {
        let users = source.read()?;
        Ok(UserDb {
            current: RwLock::new(Arc::new(users)),
            source,
            saving: parking_lot::Mutex::new(()),
        })
    }

    /// The users as loaded last; an `ACL LOAD` after this does not change them.
    pub fn snapshot(&self) -> Arc<Users> {
        self.current.read().clone()
    }

    /// [`Users::check`] against the users loaded last.
    pub fn check(&self, user: &[u8], pass: &[u8]) -> Option<Role> {
        self.snapshot().check(user, pass)
    }

    /// The users file, if there is one.
    pub fn file(&self) -> Option<&Path> {
        self.source.file.as_deref()
    }

    /// Whether `name` is the user `--requirepass` adds, which the flag owns.
    fn flag_user(&self, name: &str) -> bool {
        self.source.requirepass.is_some() && name == "default"
    }

    /// `ACL SETUSER`: creates `name` (needs a password and a role) or changes what `edit`
    /// names, keeping the rest. Takes effect for the next `AUTH`.
    pub fn set_user(&self, name: &str, edit: &UserEdit) -> Result<(), EditError> {
        if !valid_name(name) {
            return Err(EditError::Name);
        }
        if self.flag_user(name) {
            return Err(EditError::FlagUser);
        }
        let mut current = self.current.write();
        let mut users = current.users.clone();
        apply_edit(&mut users, name, edit)?;
        if has_admin(&current.users) && !has_admin(&users) {
            return Err(EditError::LastAdmin);
        }
        *current = Arc::new(Users { users });
        Ok(())
    }

    /// `ACL DELUSER`: removes the users named and answers how many there were; refused,
    /// changing nothing, when no admin would be left.
    pub fn delete_users(&self, names: &[&str]) -> Result<usize, EditError> {
        if names.iter().any(|n| self.flag_user(n)) {
            return Err(EditError::FlagUser);
        }
        let mut current = self.current.write();
        let mut named: Vec<&str> = names.to_vec();
        named.sort_unstable();
        named.dedup();
        let deleted = named
            .iter()
            .filter(|n| current.users.iter().any(|u| u.name == **n))
            .count();
        let users: Vec<User> = current
            .users
            .iter()
            .filter(|u| !names.contains(&u.name.as_str()))
            .cloned()
            .collect();
        if has_admin(&current.users) && !has_admin(&users) {
            return Err(EditError::LastAdmin);
        }
        *current = Arc::new(Users { users });
        Ok(deleted)
    }

    /// `ACL SAVE`: writes the users held to the users file, atomically and as hashes only
    /// (the `--requirepass` user is left out: the flag adds it). Returns how many it wrote.
    pub fn save(&self) -> Result<usize, EditError> {
        let path = self.source.file.as_deref().ok_or(EditError::NoFile)?;
        // One save at a time: they share the temp file.
        let _one = self.saving.lock();
        let snapshot = self.snapshot();
        let users: Vec<User> = snapshot
            .users
            .iter()
            .filter(|u| !self.flag_user(&u.name))
            .cloned()
            .collect();
        let n = users.len();
        write_atomically(path, &Users { users }.file_text()).map_err(|e| EditError::Write {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Ok(n)
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

    fn edit(pw: Option<&str>, role: Option<Role>) -> UserEdit {
        UserEdit {
            digest: pw.map(|p| digest(p.as_bytes())),
            role,
        }
    }

    #[test]
    fn set_user_creates_and_changes() {
        let db = UserDb::fixed(Users::parse("boss admin pb\n").unwrap());
        assert_eq!(
            db.set_user("shop", &edit(Some("x"), None)),
            Err(EditError::Incomplete)
        );
        db.set_user("shop", &edit(Some("p1"), Some(Role::Checkout)))
            .unwrap();
        assert_eq!(db.check(b"shop", b"p1"), Some(Role::Checkout));
        db.set_user("shop", &edit(Some("p2"), None)).unwrap();
        assert_eq!(db.check(b"shop", b"p1"), None);
        assert_eq!(db.check(b"shop", b"p2"), Some(Role::Checkout), "role kept");
        db.set_user("shop", &edit(None, Some(Role::Sweeper)))
            .unwrap();
        assert_eq!(
            db.check(b"shop", b"p2"),
            Some(Role::Sweeper),
            "password kept"
        );
        for bad in ["", "#x", "a b", "a\u{7}"] {
            assert_eq!(
                db.set_user(bad, &edit(Some("p"), Some(Role::Admin))),
                Err(EditError::Name),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_last_admin_stays() {
        let db = UserDb::fixed(Users::parse("boss admin pb\nshop checkout ps\n").unwrap());
        assert_eq!(db.delete_users(&["boss"]), Err(EditError::LastAdmin));
        assert_eq!(
            db.set_user("boss", &edit(None, Some(Role::Checkout))),
            Err(EditError::LastAdmin)
        );
        assert_eq!(db.check(b"boss", b"pb"), Some(Role::Admin));
        assert_eq!(db.delete_users(&["shop", "shop", "nobody"]), Ok(1));
        assert_eq!(db.check(b"shop", b"ps"), None);
        db.set_user("two", &edit(Some("p"), Some(Role::Admin)))
            .unwrap();
        assert_eq!(db.delete_users(&["boss"]), Ok(1));
    }

    #[test]
    fn save_writes_hashes_and_loads_back() {
        let dir = std::env::temp_dir().join(format!("sg-users-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("users");
        std::fs::write(&f, "boss admin boss-pw\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        let db = UserDb::from_source(UsersSource {
            file: Some(f.clone()),
            requirepass: Some("rp".into()),
        })
        .unwrap();
        assert_eq!(
            db.set_user("default", &edit(Some("p"), None)),
            Err(EditError::FlagUser)
        );
        db.set_user("shop", &edit(Some("shop-pw"), Some(Role::Checkout)))
            .unwrap();
        assert_eq!(db.save(), Ok(2), "the --requirepass user is not written");
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(!text.contains("boss-pw") && !text.contains("shop-pw") && !text.contains("rp\n"));
        assert!(!text.contains("default"), "{text}");
        let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640, "the old file's mode is kept");
        let back = Users::parse(&text).unwrap();
        assert_eq!(back.check(b"boss", b"boss-pw"), Some(Role::Admin));
        assert_eq!(back.check(b"shop", b"shop-pw"), Some(Role::Checkout));
        assert_eq!(db.reload(), Ok(3));
        assert_eq!(db.check(b"default", b"rp"), Some(Role::Admin));
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temp file left"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(UserDb::fixed(Users::empty()).save(), Err(EditError::NoFile));
    }

    #[test]
    fn set_user_folds_a_name_listed_twice() {
        let db =
            UserDb::fixed(Users::parse("boss admin pb\nx checkout p1\nx sweeper p2\n").unwrap());
        assert_eq!(db.check(b"x", b"p2"), Some(Role::Sweeper));
        db.set_user("x", &edit(Some("p3"), None)).unwrap();
        assert_eq!(db.check(b"x", b"p1"), None);
        assert_eq!(db.check(b"x", b"p2"), None);
        assert_eq!(db.check(b"x", b"p3"), Some(Role::Checkout));
        assert_eq!(db.snapshot().iter().count(), 2);
    }
}

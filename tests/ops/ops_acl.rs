//! Credentials an auditor accepts (docs/operations.md, "Users and passwords"): hashed
//! passwords in the users file, `ACL WHOAMI`, `ACL LIST` (hashes, never passwords),
//! `ACL LOAD` re-reading the file without a restart, and users edited over the wire
//! (`ACL SETUSER`, `DELUSER`, `GETUSER`, `SAVE`: hashes only in the file, no password in
//! the slow log), over the real binary.

use crate::common::*;
use redis::Value;

/// The hash as docs/operations.md says to make it: `printf %s 'pw' | sha256sum`.
fn sha_hex(pw: &str) -> String {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("printf %s \"$1\" | sha256sum")
        .arg("sh")
        .arg(pw)
        .output()
        .expect("run sha256sum");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let hex = text.split_whitespace().next().unwrap().to_string();
    assert_eq!(hex.len(), 64, "{text}");
    hex
}

fn error_text(r: redis::RedisResult<Value>) -> String {
    match r {
        Err(e) => e.to_string(),
        Ok(Value::ServerError(e)) => format!("{e:?}"),
        Ok(v) => panic!("not an error: {v:?}"),
    }
}

/// A connection logged in as `user` (by AUTH on connect, as redis clients do).
async fn login(
    srv: &Server,
    user: &str,
    pass: &str,
) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let info = redis::ConnectionInfo {
        addr: redis::ConnectionAddr::Tcp("127.0.0.1".into(), srv.port),
        redis: redis::RedisConnectionInfo {
            username: Some(user.into()),
            password: Some(pass.into()),
            ..Default::default()
        },
    };
    redis::Client::open(info)?
        .get_multiplexed_tokio_connection()
        .await
}

struct Setup {
    srv: Server,
    file: std::path::PathBuf,
    _dir: TempDir,
}

/// A server whose users file holds `boss` (admin, hashed), `shop` (checkout, hashed) and
/// `plain` (checkout, plaintext).
fn setup() -> Setup {
    let dir = TempDir::new("acl");
    let file = dir.path().join("users");
    std::fs::write(
        &file,
        format!(
            "# user role password-or-#sha256\nboss admin #{}\nshop checkout #{}\nplain checkout plain-pw\n",
            sha_hex("boss-pw"),
            sha_hex("shop-pw"),
        ),
    )
    .unwrap();
    let srv = Server::start(&["--users-file", file.to_str().unwrap()]);
    Setup {
        srv,
        file,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashed_password_logs_in_and_a_wrong_one_fails() {
    let s = setup();
    let mut boss = login(&s.srv, "boss", "boss-pw")
        .await
        .expect("hashed admin logs in");
    assert_eq!(
        as_str(&cmd(&mut boss, &["ACL", "WHOAMI"]).await.unwrap()),
        "boss"
    );
    let mut shop = login(&s.srv, "shop", "shop-pw")
        .await
        .expect("hashed checkout logs in");
    assert_eq!(
        as_str(&cmd(&mut shop, &["ACL", "WHOAMI"]).await.unwrap()),
        "shop"
    );
    login(&s.srv, "plain", "plain-pw")
        .await
        .expect("plaintext still accepted");
    // A wrong password, and the hash itself, are refused.
    for bad in ["wrong", "shop-pw ", &format!("#{}", sha_hex("shop-pw"))] {
        let Err(e) = login(&s.srv, "shop", bad).await else {
            panic!("{bad:?} accepted");
        };
        assert_eq!(
            e.kind(),
            redis::ErrorKind::AuthenticationFailed,
            "{bad:?}: {e}"
        );
        let mut anon = s.srv.conn().await;
        let e = error_text(cmd(&mut anon, &["AUTH", "shop", bad]).await);
        assert!(e.contains("WRONGPASS"), "{bad:?}: {e}");
    }
    let mut anon = s.srv.conn().await;
    let e = error_text(cmd(&mut anon, &["AUTH", "boss", "shop-pw"]).await);
    assert!(e.contains("WRONGPASS"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_list_shows_hashes_never_passwords() {
    let s = setup();
    let mut boss = login(&s.srv, "boss", "boss-pw").await.unwrap();
    let list = match cmd(&mut boss, &["ACL", "LIST"]).await.unwrap() {
        Value::Array(v) => v.iter().map(as_str).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    assert_eq!(list.len(), 3, "{list:?}");
    assert_eq!(
        list[0],
        format!("user boss on #{} ~* &* +@all", sha_hex("boss-pw"))
    );
    assert!(
        list[1].starts_with(&format!(
            "user shop on #{} ~* &* -@all ",
            sha_hex("shop-pw")
        )),
        "{}",
        list[1]
    );
    assert!(list[1].contains(" +reserve "), "{}", list[1]);
    assert!(!list[1].contains("+sale.create"), "{}", list[1]);
    // The plaintext user is listed by the hash of its password.
    assert!(list[2].starts_with(&format!("user plain on #{} ", sha_hex("plain-pw"))));
    let all = list.join("\n");
    for pw in ["boss-pw", "shop-pw", "plain-pw"] {
        assert!(!all.contains(pw), "{pw} shown in ACL LIST");
    }
    let users = cmd(&mut boss, &["ACL", "USERS"]).await.unwrap();
    assert_eq!(
        users,
        Value::Array(
            ["boss", "shop", "plain"]
                .map(|u| Value::BulkString(u.into()))
                .to_vec()
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_list_and_load_are_admin_only() {
    let s = setup();
    let mut shop = login(&s.srv, "shop", "shop-pw").await.unwrap();
    for sub in ["LIST", "LOAD", "USERS", "SAVE"] {
        let e = error_text(cmd(&mut shop, &["ACL", sub]).await);
        assert!(
            e.contains("NOPERM") && e.contains(&format!("acl|{}", sub.to_lowercase())),
            "{sub}: {e}"
        );
    }
    // Every user may ask who it is.
    assert_eq!(
        as_str(&cmd(&mut shop, &["ACL", "WHOAMI"]).await.unwrap()),
        "shop"
    );
    let e = error_text(cmd(&mut shop, &["CONFIG", "SET", "maxclients", "5"]).await);
    assert!(e.contains("NOPERM"), "{e}");
    for (sub, args) in [
        ("setuser", &["ACL", "SETUSER", "x", ">pw", "+@admin"][..]),
        ("deluser", &["ACL", "DELUSER", "boss"]),
        ("getuser", &["ACL", "GETUSER", "boss"]),
    ] {
        let e = error_text(cmd(&mut shop, args).await);
        assert!(
            e.contains("NOPERM") && e.contains(&format!("acl|{sub}")),
            "{sub}: {e}"
        );
    }
    login(&s.srv, "x", "pw")
        .await
        .expect_err("a checkout user created no user");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_load_after_editing_the_file() {
    let s = setup();
    let mut boss = login(&s.srv, "boss", "boss-pw").await.unwrap();
    let mut shop_before = login(&s.srv, "shop", "shop-pw").await.unwrap();
    // shop removed, newbie added (hashed), boss kept.
    std::fs::write(
        &s.file,
        format!(
            "boss admin #{}\nnewbie checkout #{}\n",
            sha_hex("boss-pw"),
            sha_hex("newbie-pw")
        ),
    )
    .unwrap();
    assert!(
        login(&s.srv, "newbie", "newbie-pw").await.is_err(),
        "not before ACL LOAD"
    );
    assert_eq!(cmd(&mut boss, &["ACL", "LOAD"]).await.unwrap(), Value::Okay);
    let mut newbie = login(&s.srv, "newbie", "newbie-pw")
        .await
        .expect("new user logs in");
    assert_eq!(
        as_str(&cmd(&mut newbie, &["ACL", "WHOAMI"]).await.unwrap()),
        "newbie"
    );
    let Err(e) = login(&s.srv, "shop", "shop-pw").await else {
        panic!("removed user accepted");
    };
    assert_eq!(e.kind(), redis::ErrorKind::AuthenticationFailed, "{e}");
    // A connection made before keeps the role it logged in with.
    assert_eq!(
        as_str(&cmd(&mut shop_before, &["ACL", "WHOAMI"]).await.unwrap()),
        "shop"
    );
    let r = format!("{:?}", cmd(&mut shop_before, &["STOCK", "nosuch"]).await);
    assert!(!r.contains("NOPERM") && !r.contains("NOAUTH"), "{r}");

    // A bad file is refused with its line, and the users held stay.
    std::fs::write(&s.file, "boss admin #nothex\nnewbie checkout x\n").unwrap();
    let e = error_text(cmd(&mut boss, &["ACL", "LOAD"]).await);
    assert!(e.contains("users file line 1"), "{e}");
    assert!(e.contains("unchanged"), "{e}");
    std::fs::write(&s.file, "boss admin boss-pw\nwho-knows\n").unwrap();
    let e = error_text(cmd(&mut boss, &["ACL", "LOAD"]).await);
    assert!(e.contains("users file line 2"), "{e}");
    login(&s.srv, "newbie", "newbie-pw")
        .await
        .expect("old users still work");
    login(&s.srv, "boss", "boss-pw")
        .await
        .expect("old users still work");
    // A file emptied of users would open the server: refused.
    std::fs::write(&s.file, "# nobody\n").unwrap();
    let e = error_text(cmd(&mut boss, &["ACL", "LOAD"]).await);
    assert!(e.contains("lists no users"), "{e}");
    login(&s.srv, "newbie", "newbie-pw")
        .await
        .expect("old users still work");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_users_whoami_is_default_and_load_says_why() {
    let srv = Server::start(&[]);
    let mut c = srv.conn().await;
    assert_eq!(
        as_str(&cmd(&mut c, &["ACL", "WHOAMI"]).await.unwrap()),
        "default"
    );
    let e = error_text(cmd(&mut c, &["ACL", "LOAD"]).await);
    assert!(e.contains("without --users-file"), "{e}");
}

/// redis-py, as a checkout service would connect: hashed users log in, wrong passwords
/// raise, ACL LIST shows no password.
#[test]
fn redis_py_logs_in_with_hashed_passwords() {
    let s = setup();
    let script = format!("{}/tests/py/acl.py", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(s.srv.port.to_string())
        .args(["boss:boss-pw", "shop:shop-pw", "plain:plain-pw"])
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("redis-py acl ok"),
        "acl.py failed (needs `pip install redis`):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn list_of(v: Value) -> Vec<String> {
    match v {
        Value::Array(v) => v.iter().map(as_str).collect(),
        other => panic!("{other:?}"),
    }
}

/// Users made over the wire log in with their role's rights, change password, go away, and
/// survive a restart through ACL SAVE, whose file holds hashes only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setuser_deluser_save_over_the_wire() {
    let s = setup();
    let mut boss = login(&s.srv, "boss", "boss-pw").await.unwrap();
    let ok = |v: Value| assert_eq!(v, Value::Okay);
    ok(cmd(
        &mut boss,
        &[
            "ACL",
            "SETUSER",
            "cart",
            "on",
            ">cart-pw-1",
            "+@checkout",
            "~*",
            "&*",
        ],
    )
    .await
    .unwrap());
    let mut cart = login(&s.srv, "cart", "cart-pw-1")
        .await
        .expect("a new user logs in");
    assert_eq!(
        as_str(&cmd(&mut cart, &["ACL", "WHOAMI"]).await.unwrap()),
        "cart"
    );
    let r = format!("{:?}", cmd(&mut cart, &["STOCK", "nosuch"]).await);
    assert!(!r.contains("NOPERM"), "checkout may read stock: {r}");
    let e = error_text(cmd(&mut cart, &["SALE.CREATE", "S", "10"]).await);
    assert!(e.contains("NOPERM"), "{e}");
    let e = error_text(cmd(&mut cart, &["CONFIG", "SET", "maxclients", "5"]).await);
    assert!(e.contains("NOPERM"), "{e}");

    // A new password replaces the old one; the role is kept.
    ok(cmd(&mut boss, &["ACL", "SETUSER", "cart", ">cart-pw-2"])
        .await
        .unwrap());
    let Err(e) = login(&s.srv, "cart", "cart-pw-1").await else {
        panic!("old password accepted");
    };
    assert_eq!(e.kind(), redis::ErrorKind::AuthenticationFailed, "{e}");
    let mut cart2 = login(&s.srv, "cart", "cart-pw-2")
        .await
        .expect("new password");
    let e = error_text(cmd(&mut cart2, &["SALE.CREATE", "S", "10"]).await);
    assert!(e.contains("NOPERM"), "still checkout: {e}");
    // A connection logged in before keeps its role.
    assert_eq!(
        as_str(&cmd(&mut cart, &["ACL", "WHOAMI"]).await.unwrap()),
        "cart"
    );

    // A user given by its hash, as admin through +@all.
    let hash = format!("#{}", sha_hex("ops-pw"));
    ok(cmd(&mut boss, &["ACL", "SETUSER", "ops", &hash, "+@all"])
        .await
        .unwrap());
    let mut ops = login(&s.srv, "ops", "ops-pw")
        .await
        .expect("hashed user logs in");
    ok(cmd(&mut ops, &["SALE.CREATE", "S", "10"]).await.unwrap());

    // GETUSER: Redis's shape, the hash and the role's rules.
    let g = cmd(&mut boss, &["ACL", "GETUSER", "cart"]).await.unwrap();
    let Value::Array(g) = g else { panic!("{g:?}") };
    assert_eq!(as_str(&g[0]), "flags");
    assert_eq!(g[1], Value::Array(vec![Value::BulkString(b"on".to_vec())]));
    assert_eq!(as_str(&g[2]), "passwords");
    assert_eq!(
        g[3],
        Value::Array(vec![Value::BulkString(sha_hex("cart-pw-2").into_bytes())])
    );
    assert_eq!(as_str(&g[4]), "commands");
    assert!(as_str(&g[5]).starts_with("-@all +"), "{:?}", g[5]);
    assert_eq!(
        cmd(&mut boss, &["ACL", "GETUSER", "nobody"]).await.unwrap(),
        Value::Nil
    );

    // DELUSER answers how many it deleted; the user no longer logs in, and its sessions
    // end (as Redis ends them).
    let mut plain = login(&s.srv, "plain", "plain-pw")
        .await
        .expect("plain logs in");
    assert_eq!(
        as_str(&cmd(&mut plain, &["ACL", "WHOAMI"]).await.unwrap()),
        "plain"
    );
    assert_eq!(
        cmd(&mut boss, &["ACL", "DELUSER", "plain", "nobody", "plain"])
            .await
            .unwrap(),
        Value::Int(1)
    );
    assert!(
        login(&s.srv, "plain", "plain-pw").await.is_err(),
        "deleted user logs in"
    );
    let after = cmd(&mut plain, &["ACL", "WHOAMI"]).await;
    assert!(
        after.is_err(),
        "a deleted user's session still answered: {after:?}"
    );
    assert_eq!(
        as_str(&cmd(&mut boss, &["ACL", "WHOAMI"]).await.unwrap()),
        "boss",
        "the deleting connection stays"
    );

    // SAVE writes hashes only; a restart from the file has the same users.
    ok(cmd(&mut boss, &["ACL", "SAVE"]).await.unwrap());
    let text = std::fs::read_to_string(&s.file).unwrap();
    for pw in [
        "boss-pw",
        "shop-pw",
        "cart-pw-1",
        "cart-pw-2",
        "ops-pw",
        "plain",
    ] {
        assert!(!text.contains(pw), "{pw} in the saved file:\n{text}");
    }
    assert!(
        text.contains(&format!("cart checkout #{}", sha_hex("cart-pw-2"))),
        "{text}"
    );
    let list_before = list_of(cmd(&mut boss, &["ACL", "LIST"]).await.unwrap());
    let srv2 = Server::start(&["--users-file", s.file.to_str().unwrap()]);
    let mut boss2 = login(&srv2, "boss", "boss-pw")
        .await
        .expect("boss after restart");
    login(&srv2, "cart", "cart-pw-2")
        .await
        .expect("cart after restart");
    login(&srv2, "ops", "ops-pw")
        .await
        .expect("ops after restart");
    assert!(login(&srv2, "plain", "plain-pw").await.is_err());
    assert_eq!(
        list_of(cmd(&mut boss2, &["ACL", "LIST"]).await.unwrap()),
        list_before
    );

    // LOAD drops what was not saved.
    ok(cmd(
        &mut boss,
        &["ACL", "SETUSER", "temp", ">temp-pw", "+@sweeper"],
    )
    .await
    .unwrap());
    login(&s.srv, "temp", "temp-pw")
        .await
        .expect("temp logs in");
    ok(cmd(&mut boss, &["ACL", "LOAD"]).await.unwrap());
    assert!(
        login(&s.srv, "temp", "temp-pw").await.is_err(),
        "unsaved user kept by LOAD"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setuser_deluser_save_refusals() {
    let s = setup();
    let mut boss = login(&s.srv, "boss", "boss-pw").await.unwrap();
    for (args, want) in [
        (
            &["ACL", "SETUSER", "u", ">pw", "+get"][..],
            "the rule '+get' is not supported",
        ),
        (
            &["ACL", "SETUSER", "u", ">pw", "+@checkout", "nopass"],
            "'nopass' is refused",
        ),
        (
            &["ACL", "SETUSER", "u", ">pw", "+@checkout", "off"],
            "'off' is not supported",
        ),
        (&["ACL", "SETUSER", "u", "+@root"], "names no role"),
        (
            &["ACL", "SETUSER", "u", ">pw"],
            "a new user needs a password",
        ),
        (
            &["ACL", "SETUSER", "#u", ">pw", "+@admin"],
            "must not start with `#`",
        ),
        (&["ACL", "DELUSER", "boss"], "no admin user"),
        (&["ACL", "SETUSER", "boss", "+@checkout"], "no admin user"),
    ] {
        let e = error_text(cmd(&mut boss, args).await);
        assert!(e.contains(want), "{args:?}: {e}");
        assert!(!e.contains("pw"), "{args:?} echoes a password: {e}");
    }
    login(&s.srv, "boss", "boss-pw")
        .await
        .expect("boss unchanged");
    assert!(
        login(&s.srv, "u", "pw").await.is_err(),
        "a refused SETUSER made a user"
    );

    // No users file: SAVE has nowhere to write; the edits still work in memory.
    let rp = Server::start(&["--requirepass", "rp-pw"]);
    let mut def = login(&rp, "default", "rp-pw").await.unwrap();
    let e = error_text(cmd(&mut def, &["ACL", "SAVE"]).await);
    assert!(e.contains("without --users-file"), "{e}");
    let e = error_text(cmd(&mut def, &["ACL", "SETUSER", "default", ">other"]).await);
    assert!(e.contains("--requirepass"), "{e}");
    let open = Server::start(&[]);
    let mut c = open.conn().await;
    let e = error_text(cmd(&mut c, &["ACL", "SETUSER", "u", ">pw", "+@admin"]).await);
    assert!(e.contains("runs without users"), "{e}");
}

/// The slow log keeps no rule of ACL SETUSER, so no password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowlog_does_not_show_setuser_passwords() {
    let dir = TempDir::new("acl-slow");
    let file = dir.path().join("users");
    std::fs::write(&file, "boss admin boss-pw\n").unwrap();
    let srv = Server::start(&[
        "--users-file",
        file.to_str().unwrap(),
        "--slowlog-log-slower-than",
        "0",
    ]);
    let mut boss = login(&srv, "boss", "boss-pw").await.unwrap();
    let hash = format!("#{}", sha_hex("hashed-secret"));
    assert_eq!(
        cmd(
            &mut boss,
            &["ACL", "SETUSER", "cart", ">very-secret", "+@checkout"]
        )
        .await
        .unwrap(),
        Value::Okay
    );
    assert_eq!(
        cmd(&mut boss, &["ACL", "SETUSER", "cart", &hash])
            .await
            .unwrap(),
        Value::Okay
    );
    let log = format!(
        "{:?}",
        cmd(&mut boss, &["SLOWLOG", "GET", "-1"]).await.unwrap()
    );
    assert!(log.contains("cart") && log.contains("(redacted)"), "{log}");
    for secret in ["very-secret", &sha_hex("hashed-secret"), "boss-pw"] {
        assert!(!log.contains(secret), "{secret} in SLOWLOG GET: {log}");
    }
}

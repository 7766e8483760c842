//! Where the Postgres ledger lives: a schema of its own (`--schema`, default `stockgate`),
//! so its generic table names (`orders`, `sales`, ...) never meet an application's.
//!
//! Every pooled connection gets `search_path` = that schema and nothing else, so the
//! migrations (sqlx's `_sqlx_migrations` included) and every query stay unqualified and
//! land there, and two ledgers in two schemas of one database cannot see each other.
//!
//! A ledger created before the schema option lives where the connection's default
//! `search_path` put it: `public`, or a schema named after the user if one exists
//! (`old_layout_schema`). It is recognised by a `_sqlx_migrations` there holding our
//! first migration (same checksum) beside our tables; `stockgate-sweeper migrate` moves
//! it into the schema in one transaction (`move_old_ledger`), and every other start
//! refuses it with that instruction ([`SchemaError::OldLayout`]) instead of silently
//! opening an empty ledger beside it.

use sqlx::postgres::PgConnection;
use sqlx::{Connection, Row};

/// The schema a ledger goes to unless told otherwise.
pub const DEFAULT_SCHEMA: &str = "stockgate";

/// The environment variable the tools read `--schema` from.
pub const SCHEMA_ENV: &str = "STOCKGATE_LEDGER_SCHEMA";

/// Every table the migrations create, sqlx's bookkeeping included: what a move from
/// the old layout takes along. `tests/ledger/ledger_schema.rs` checks it against a freshly migrated
/// schema, so a migration that adds a table cannot be forgotten here.
pub const LEDGER_TABLES: &[&str] = &[
    "_sqlx_migrations",
    "sales",
    "orders",
    "order_events",
    "sale_adjustments",
    "feed_position",
    "server_bindings",
    "split_parents",
    "split_parts",
];

/// The views the migrations create (the read-only `server_binding` of migration 0009):
/// moved along with the tables.
pub const LEDGER_VIEWS: &[&str] = &["server_binding"];

/// The functions of `migrations/0006_ledger_functions.sql`,
/// `migrations/0007_materializer_functions.sql` and `migrations/0008_split_sales.sql` (the ledger's rules, and their helpers): what a move from the old layout takes along besides the trigger functions.
/// `tests/ledger/ledger_schema.rs` checks it against a freshly migrated schema.
pub const LEDGER_FUNCTIONS: &[&str] = &[
    "stockgate_ms_to_ts",
    "stockgate_check_ms",
    "stockgate_check_token",
    "stockgate_refuse",
    "stockgate_not_found",
    "materialize_order",
    "pay_order",
    "cancel_order",
    "extend_order",
    "mark_refund_required",
    "mark_refunded",
    "order_is_hold",
    "sweep_cancel_expired",
    "sweep_tombstone",
    "stockgate_check_parallel",
    "materialize_reserved",
    "materialize_transition",
    "materialize_extended",
    "feed_set_position",
    "split_check_parent",
    "split_over_limit",
];

/// The tables whose presence (with our migration rows) marks a ledger of the old layout.
const MARKER_TABLES: &[&str] = &["_sqlx_migrations", "sales", "orders", "order_events"];

/// Serialises concurrent moves (two `migrate` runs at once): the second one waits, then
/// finds the ledger already moved. Any constant; it only has to be ours.
const MOVE_LOCK_KEY: i64 = 0x7374_6f63_6b67_7465; // "stockgte"

/// Why the ledger's Postgres schema could not be checked, created or moved into.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The schema name is not a plain identifier; `why` says which rule it breaks.
    #[error(
        "invalid ledger schema name `{name}`: {why} (a plain name such as `stockgate` or \
         `shop_ledger`)"
    )]
    Invalid {
        /// The name given.
        name: String,
        /// The rule it breaks.
        why: &'static str,
    },
    /// The ledger is in another schema than the one asked for; the message says how to move it.
    #[error(
        "the ledger is in schema {found_in} (where versions before --schema kept it), not in \
         schema {schema}: stop every stockgate tool, then run `stockgate-sweeper migrate \
         --schema {schema}` once to move it there (or pass --schema {found_in} to keep using \
         it where it is)"
    )]
    OldLayout {
        /// The schema the ledger was found in.
        found_in: String,
        /// The schema asked for.
        schema: String,
    },
    /// Creating the schema was refused (usually a permission).
    #[error(
        "cannot create schema {schema}: {source} (create it once as a role that may, e.g. \
         `CREATE SCHEMA {schema} AUTHORIZATION <ledger user>`, or grant this user CREATE on \
         the database)"
    )]
    Create {
        /// The schema.
        schema: String,
        /// What Postgres answered.
        #[source]
        source: sqlx::Error,
    },
    /// The target schema holds a table of the ledger's name that is not a ledger.
    #[error(
        "schema {schema} already has a table {table} but no stockgate ledger: the ledger in \
         {from} cannot be moved there (rename or drop that table, or choose another --schema)"
    )]
    Occupied {
        /// The schema the ledger is in.
        from: String,
        /// The schema asked for.
        schema: String,
        /// The table in the way.
        table: String,
    },
    /// Moving the ledger's tables failed; the transaction rolled back, so nothing moved.
    #[error(
        "moving the ledger from schema {from} to schema {schema} failed, nothing was moved: \
         {source}{hint}"
    )]
    Move {
        /// The schema the ledger is in.
        from: String,
        /// The schema asked for.
        schema: String,
        /// What Postgres answered.
        #[source]
        source: sqlx::Error,
        /// Advice appended to the message (a missing privilege, say), or empty.
        hint: &'static str,
    },
}

impl SchemaError {
    /// The database error underneath, if any (for the retry decision).
    pub fn db_error(&self) -> Option<&sqlx::Error> {
        match self {
            SchemaError::Create { source, .. } | SchemaError::Move { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A plain identifier that needs no quoting anywhere: lowercase letters, digits and
/// underscores, not starting with a digit, at most 63 bytes (Postgres's limit), and not
/// one of Postgres's own schemas. Being plain, it is safe to splice into SQL.
pub fn validate_schema(name: &str) -> Result<(), SchemaError> {
    let bad = |why| {
        Err(SchemaError::Invalid {
            name: name.to_string(),
            why,
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > 63 {
        return bad("it is longer than 63 bytes, Postgres's limit");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return bad("use only lowercase letters a-z, digits and underscores");
    }
    if name.as_bytes()[0].is_ascii_digit() {
        return bad("it must start with a letter or an underscore");
    }
    if name.starts_with("pg_") || name == "information_schema" {
        return bad("that name is reserved for Postgres's own schemas");
    }
    Ok(())
}

/// `validate_schema` for clap's `value_parser`.
pub fn parse_schema(s: &str) -> Result<String, String> {
    validate_schema(s)
        .map(|()| s.to_string())
        .map_err(|e| match e {
            SchemaError::Invalid { why, .. } => why.to_string(),
            other => other.to_string(),
        })
}

/// The statement every pooled connection runs first. `schema` is validated (plain).
pub(crate) fn search_path_sql(schema: &str) -> String {
    format!("SET search_path TO {schema}")
}

/// `name` quoted for SQL (for names read from the catalog, which may need it).
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

async fn tables_in(conn: &mut PgConnection, schema: &str) -> Result<Vec<String>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT tablename::text FROM pg_catalog.pg_tables WHERE schemaname = $1 ORDER BY 1",
    )
    .bind(schema)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(|r| r.try_get::<String, _>(0)).collect()
}

/// Whether `schema` holds a ledger (sqlx's migrations table is there).
pub(crate) async fn has_ledger(conn: &mut PgConnection, schema: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables \
         WHERE schemaname = $1 AND tablename = '_sqlx_migrations')",
    )
    .bind(schema)
    .fetch_one(&mut *conn)
    .await
}

/// The schema versions before `--schema` created the ledger in: the first existing
/// schema of the connection's default `search_path` (`"$user", public` unless the role or
/// database says otherwise), i.e. `public`, or the user's own schema if there is one.
/// Read inside a transaction that is rolled back, so this connection's own search_path
/// is back in force whatever happens.
pub(crate) async fn old_layout_schema(
    conn: &mut PgConnection,
) -> Result<Option<String>, sqlx::Error> {
    let mut tx = conn.begin().await?;
    sqlx::query("SET LOCAL search_path TO DEFAULT")
        .execute(&mut *tx)
        .await?;
    let schema: Option<String> = sqlx::query_scalar("SELECT current_schema()::text")
        .fetch_one(&mut *tx)
        .await?;
    tx.rollback().await?;
    Ok(schema)
}

/// Whether `schema` holds a stockgate ledger of the layout before `--schema`: our tables,
/// and a `_sqlx_migrations` whose first migration is ours (same checksum), so another
/// application's `orders` table or sqlx migrations are never taken for ours.
pub(crate) async fn holds_old_ledger(
    conn: &mut PgConnection,
    schema: &str,
) -> Result<bool, sqlx::Error> {
    let present = tables_in(conn, schema).await?;
    if !MARKER_TABLES.iter().all(|t| present.iter().any(|p| p == t)) {
        return Ok(false);
    }
    let checksum: Option<Vec<u8>> = match sqlx::query_scalar(&format!(
        "SELECT checksum FROM {}._sqlx_migrations WHERE version = 1 AND success",
        quote_ident(schema)
    ))
    .fetch_optional(&mut *conn)
    .await
    {
        Ok(c) => c,
        // 42P01 undefined_table: a concurrent move took it away since the listing.
        Err(sqlx::Error::Database(d)) if d.code().as_deref() == Some("42P01") => return Ok(false),
        Err(e) => return Err(e),
    };
    let ours = super::migrations::migrator();
    Ok(match (checksum, ours.migrations.first()) {
        (Some(c), Some(m)) => c == m.checksum.as_ref(),
        _ => false,
    })
}

async fn schema_exists(conn: &mut PgConnection, schema: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)")
        .bind(schema)
        .fetch_one(&mut *conn)
        .await
}

/// Create `schema` if it does not exist. Looked up first: `CREATE SCHEMA IF NOT EXISTS`
/// needs CREATE on the database even when the schema is there, and an operator may have
/// created it for a user who has no such right.
pub(crate) async fn ensure_schema(
    conn: &mut PgConnection,
    schema: &str,
) -> Result<(), super::LedgerError> {
    if schema_exists(conn, schema).await? {
        return Ok(());
    }
    sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
        .execute(&mut *conn)
        .await
        .map_err(|source| SchemaError::Create {
            schema: schema.to_string(),
            source,
        })?;
    Ok(())
}

/// What a move from the old layout did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MovedLedger {
    /// Where it was (normally `public`).
    pub from: String,
    /// Where it is now.
    pub schema: String,
    /// The tables moved (their indexes, constraints, triggers and owned sequences go
    /// with them).
    pub tables: Vec<String>,
    /// The functions moved (trigger functions and the ledger's rule functions).
    pub functions: Vec<String>,
    /// Orders in the moved ledger.
    pub orders: i64,
}

/// Move the ledger of the old layout from schema `from` into `schema`, in one
/// transaction: either everything is moved or nothing. `Ok(None)` when there is nothing
/// to move (the schema already has a ledger, e.g. a concurrent move finished first, or
/// `from` holds none).
pub(crate) async fn move_old_ledger(
    conn: &mut PgConnection,
    from: &str,
    schema: &str,
) -> Result<Option<MovedLedger>, super::LedgerError> {
    let failed = |source: sqlx::Error| move_failed(from, schema, source);
    let mut tx = conn.begin().await?;
    lock_for_move(&mut tx).await?;
    if has_ledger(&mut tx, schema).await? || !holds_old_ledger(&mut tx, from).await? {
        return Ok(None);
    }
    create_schema_if_missing(&mut tx, schema).await?;
    let tables = tables_to_move(&mut tx, from, schema).await?;
    let functions = functions_to_move(&mut tx, from, &tables).await?;
    let from_q = quote_ident(from);
    let orders: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {from_q}.orders"))
        .fetch_one(&mut *tx)
        .await?;
    move_tables_and_views(&mut tx, from, schema, &tables).await?;
    move_functions(&mut tx, from, schema, &functions).await?;
    tx.commit().await.map_err(failed)?;
    Ok(Some(MovedLedger {
        from: from.to_string(),
        schema: schema.to_string(),
        tables,
        functions: functions.into_iter().map(|(name, _, _)| name).collect(),
        orders,
    }))
}

/// The error of a step of the move, with a hint when a table is in use.
fn move_failed(from: &str, schema: &str, source: sqlx::Error) -> SchemaError {
    // 55P03: lock_timeout below expired, a table is in use.
    let in_use = matches!(&source, sqlx::Error::Database(d)
        if d.code().as_deref() == Some("55P03"));
    SchemaError::Move {
        from: from.to_string(),
        schema: schema.to_string(),
        source,
        hint: if in_use {
            " (a ledger table is in use: stop every stockgate tool still running on the \
             old layout, then run migrate again)"
        } else {
            ""
        },
    }
}

/// Bounds the wait for the tables and takes the move's lock, both for the transaction.
async fn lock_for_move(tx: &mut PgConnection) -> Result<(), sqlx::Error> {
    // A tool of the old version still holding a table would otherwise make this wait
    // forever, silently.
    sqlx::query("SET LOCAL lock_timeout = '10s'")
        .execute(&mut *tx)
        .await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MOVE_LOCK_KEY)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Creates `schema` unless it exists.
async fn create_schema_if_missing(
    tx: &mut PgConnection,
    schema: &str,
) -> Result<(), super::LedgerError> {
    if !schema_exists(tx, schema).await? {
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&mut *tx)
            .await
            .map_err(|source| SchemaError::Create {
                schema: schema.to_string(),
                source,
            })?;
    }
    Ok(())
}

/// The ledger's tables present in `from`, in `LEDGER_TABLES` order; refused when one of
/// them already exists in `schema`.
async fn tables_to_move(
    tx: &mut PgConnection,
    from: &str,
    schema: &str,
) -> Result<Vec<String>, super::LedgerError> {
    let here = tables_in(tx, schema).await?;
    let there = tables_in(tx, from).await?;
    let tables: Vec<String> = LEDGER_TABLES
        .iter()
        .filter(|t| there.iter().any(|p| p == *t))
        .map(|t| t.to_string())
        .collect();
    if let Some(clash) = tables.iter().find(|t| here.contains(t)) {
        return Err(SchemaError::Occupied {
            from: from.to_string(),
            schema: schema.to_string(),
            table: clash.clone(),
        }
        .into());
    }
    Ok(tables)
}

/// The functions our tables' triggers call (found through the triggers, so whatever
/// a migration names them they go along; triggers refer to them by oid, so they keep
/// working wherever the functions are), and the ledger's rule functions by name:
/// `(name, signature, pinned)`. `pinned`: created with `SET search_path FROM CURRENT`,
/// so pinned to `from`; they are re-pinned to `schema`, or their bodies would look for
/// the tables where they no longer are.
async fn functions_to_move(
    tx: &mut PgConnection,
    from: &str,
    tables: &[String],
) -> Result<Vec<(String, String, bool)>, sqlx::Error> {
    sqlx::query(
        "SELECT DISTINCT p.proname::text, p.oid::regprocedure::text, \
                p.proconfig IS NOT NULL AND EXISTS ( \
                    SELECT 1 FROM unnest(p.proconfig) AS c(s) WHERE c.s LIKE 'search_path=%') \
         FROM pg_catalog.pg_proc p \
         JOIN pg_catalog.pg_namespace pn ON pn.oid = p.pronamespace \
         WHERE pn.nspname = $1 AND ( \
             p.proname = ANY($3) OR EXISTS ( \
                 SELECT 1 FROM pg_catalog.pg_trigger t \
                 JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid \
                 JOIN pg_catalog.pg_namespace cn ON cn.oid = c.relnamespace \
                 WHERE t.tgfoid = p.oid AND NOT t.tgisinternal AND cn.nspname = $1 \
                   AND c.relname = ANY($2))) \
         ORDER BY 1",
    )
    .bind(from)
    .bind(tables)
    .bind(LEDGER_FUNCTIONS)
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
    .collect()
}

/// Moves `tables`, then the ledger's views found in `from`, into `schema`.
async fn move_tables_and_views(
    tx: &mut PgConnection,
    from: &str,
    schema: &str,
    tables: &[String],
) -> Result<(), super::LedgerError> {
    let failed = |source: sqlx::Error| move_failed(from, schema, source);
    let from_q = quote_ident(from);
    for t in tables {
        // Table names from LEDGER_TABLES and `schema` are plain, safe to splice in.
        sqlx::query(&format!("ALTER TABLE {from_q}.{t} SET SCHEMA {schema}"))
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
    }
    let views: Vec<String> = sqlx::query_scalar(
        "SELECT viewname::text FROM pg_catalog.pg_views \
         WHERE schemaname = $1 AND viewname = ANY($2)",
    )
    .bind(from)
    .bind(LEDGER_VIEWS)
    .fetch_all(&mut *tx)
    .await?;
    for v in &views {
        // View names from LEDGER_VIEWS, plain like the tables'.
        sqlx::query(&format!("ALTER VIEW {from_q}.{v} SET SCHEMA {schema}"))
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
    }
    Ok(())
}

/// Moves `functions` into `schema`, re-pinning the pinned ones' search_path first.
async fn move_functions(
    tx: &mut PgConnection,
    from: &str,
    schema: &str,
    functions: &[(String, String, bool)],
) -> Result<(), super::LedgerError> {
    let failed = |source: sqlx::Error| move_failed(from, schema, source);
    for (_, signature, pinned) in functions {
        // `signature` is the catalog's own rendering: quoted as needed, and qualified,
        // `from` not being on this connection's search_path.
        if *pinned {
            sqlx::query(&format!(
                "ALTER FUNCTION {signature} SET search_path TO {schema}"
            ))
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        }
        sqlx::query(&format!("ALTER FUNCTION {signature} SET SCHEMA {schema}"))
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_pass_and_others_say_why() {
        for ok in [
            "stockgate",
            "shop_ledger",
            "_x",
            "a1",
            "public",
            &"a".repeat(63),
        ] {
            assert!(validate_schema(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("Stockgate", "lowercase"),
            ("shop-ledger", "lowercase"),
            ("a b", "lowercase"),
            ("x;drop", "lowercase"),
            ("\"q\"", "lowercase"),
            ("1ledger", "start with a letter"),
            ("pg_ledger", "reserved"),
            ("information_schema", "reserved"),
            (&"a".repeat(64), "63 bytes"),
        ] {
            let e = validate_schema(bad).expect_err(bad).to_string();
            assert!(
                e.contains(why) && e.contains("invalid ledger schema name"),
                "{bad}: {e}"
            );
        }
    }
}

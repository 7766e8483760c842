//! The ledger's migrations (`migrations/`), embedded so the tools do not depend on their
//! working directory. Used by the Postgres ledger and by the schema checks that recognise
//! a ledger of ours.

use std::borrow::Cow;

use sqlx::migrate::{Migration, MigrationType, Migrator};

const INIT_SQL: &str = include_str!("../../../migrations/0001_init.sql");
const ALLOCATION_SQL: &str = include_str!("../../../migrations/0002_allocation_adjustments.sql");
const FEED_POSITION_SQL: &str = include_str!("../../../migrations/0003_feed_position.sql");
const FINGERPRINT_SQL: &str =
    include_str!("../../../migrations/0004_feed_position_fingerprint.sql");
const BINDING_SQL: &str = include_str!("../../../migrations/0005_server_binding.sql");
const FUNCTIONS_SQL: &str = include_str!("../../../migrations/0006_ledger_functions.sql");
const MATERIALIZER_SQL: &str = include_str!("../../../migrations/0007_materializer_functions.sql");
const SPLIT_SQL: &str = include_str!("../../../migrations/0008_split_sales.sql");
const GROUP_BINDINGS_SQL: &str = include_str!("../../../migrations/0009_group_bindings.sql");
const SPLIT_LIMIT_SQL: &str = include_str!("../../../migrations/0010_split_user_limit.sql");

/// The migrator for `migrations/` (embedded copy).
pub fn migrator() -> Migrator {
    let m = |version, name, sql| {
        Migration::new(
            version,
            Cow::Borrowed(name),
            MigrationType::Simple,
            Cow::Borrowed(sql),
            false,
        )
    };
    Migrator {
        migrations: Cow::Owned(vec![
            m(1, "init", INIT_SQL),
            m(2, "allocation adjustments", ALLOCATION_SQL),
            m(3, "feed position", FEED_POSITION_SQL),
            m(4, "feed position fingerprint", FINGERPRINT_SQL),
            m(5, "server binding", BINDING_SQL),
            m(6, "ledger functions", FUNCTIONS_SQL),
            m(7, "materializer functions", MATERIALIZER_SQL),
            m(8, "split sales", SPLIT_SQL),
            m(9, "group bindings", GROUP_BINDINGS_SQL),
            m(10, "split user limit", SPLIT_LIMIT_SQL),
        ]),
        ..Migrator::DEFAULT
    }
}

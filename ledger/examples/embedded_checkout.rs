//! A whole flash sale in one process: the engine as a library (no TCP), the sled ledger,
//! the sweeper as a task, and 10,000 buyers for 1,000 units — some pay in time, some pay
//! late, some cancel, some just walk away. Prints the outcome and checks the invariants.
//!
//! ```text
//! cargo run --release -p stockgate-client --example embedded_checkout [-- --buyers 10000 --units 1000]
//! ```

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use stockgate_client::types::now_ms;
use stockgate_client::{EngineGate, ReservationGate};
use stockgate_core::engine::{
    Engine, EngineConfig, Keyring, NullSink, ReservationKey, SystemClock,
};
use stockgate_ledger::checkout::{CheckoutError, PayOutcome};
use stockgate_ledger::ledger::SaleRecord;
use stockgate_ledger::{Checkout, Ledger, SledLedger, Sweeper, SweeperConfig};
use tokio::sync::Semaphore;

const SKU: &str = "FLASH-1";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Plan {
    PayInTime,
    PayLate,
    Cancel,
    Abandon,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Outcome {
    Bought,
    SoldOut,
    LateRefused,
    LateRefundRequired,
    Cancelled,
    Abandoned,
    Other(String),
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> ExitCode {
    let buyers = arg("--buyers", 10_000);
    let units = arg("--units", 1_000);
    let ttl_ms = arg("--ttl-ms", 1_500);

    // --- the engine, embedded -----------------------------------------------------------
    let keyring = match Keyring::parse(&Keyring::generate_file_text()) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("keyring: {e}");
            return ExitCode::FAILURE;
        }
    };
    let reservation_key = ReservationKey::from_bytes(&rand::random());
    let engine = Arc::new(Engine::new(
        EngineConfig::default(),
        Arc::new(SystemClock::new()),
        // No WAL: the ledger is this deployment's durable record.
        Arc::new(NullSink),
        keyring.clone(),
        reservation_key,
    ));
    if let Err(e) = engine.create_sale(SKU, units, Some(16), Some(ttl_ms), Some(1)) {
        eprintln!("create sale: {e}");
        return ExitCode::FAILURE;
    }
    let gate = EngineGate::new(engine.clone());

    // --- the ledger, embedded (sled) ----------------------------------------------------
    let dir = std::env::temp_dir().join(format!("stockgate-embedded-{}", std::process::id()));
    let ledger = match SledLedger::open(&dir) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("ledger: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut sale = SaleRecord::new(SKU, units);
    sale.ttl_ms = Some(ttl_ms);
    sale.key_fingerprint = Some(engine.key_fingerprint().to_string());
    if let Err(e) = ledger.register_sale(&sale).await {
        eprintln!("register sale: {e}");
        return ExitCode::FAILURE;
    }

    // --- the sweeper, as a task ---------------------------------------------------------
    let sweeper = Sweeper::new(
        ledger.clone(),
        gate.clone(),
        SweeperConfig {
            interval: Duration::from_millis(250),
            batch_size: 500,
            ..Default::default()
        },
    );
    let sweeper_task = sweeper.clone().spawn();
    // Housekeeping (retention purge) as the server would run it.
    let ticker = {
        let engine = engine.clone();
        tokio::spawn(async move {
            loop {
                engine.tick();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // --- the buyers -----------------------------------------------------------------------
    let checkout = Checkout::new(ledger.clone(), gate.clone());
    let started = Instant::now();
    let deadline = now_ms() + 6 * ttl_ms as i64;
    let gate_open = Arc::new(Semaphore::new(400));
    let mut tasks = Vec::with_capacity(buyers as usize);
    for i in 0..buyers {
        let checkout = checkout.clone();
        let keyring = keyring.clone();
        let gate_open = gate_open.clone();
        let plan = match i % 20 {
            0..=8 => Plan::PayInTime, // 45%
            9..=10 => Plan::PayLate,  // 10%
            11..=13 => Plan::Cancel,  // 15%
            _ => Plan::Abandon,       // 30%
        };
        tasks.push(tokio::spawn(async move {
            let _permit = gate_open.acquire_owned().await;
            let out = buyer(&checkout, &keyring, i, plan, ttl_ms, deadline).await;
            (plan, out)
        }));
    }
    let mut outcomes: HashMap<Outcome, u64> = HashMap::new();
    let mut late_bad = 0u64;
    for t in tasks {
        match t.await {
            Ok((plan, out)) => {
                if plan == Plan::PayLate
                    && !matches!(
                        out,
                        Outcome::LateRefused | Outcome::LateRefundRequired | Outcome::SoldOut
                    )
                {
                    late_bad += 1;
                }
                *outcomes.entry(out).or_default() += 1;
            }
            Err(e) => *outcomes.entry(Outcome::Other(e.to_string())).or_default() += 1,
        }
    }
    let buyers_done = started.elapsed();

    // Let every hold expire, then one last pass settles what the task has not yet.
    tokio::time::sleep(Duration::from_millis(ttl_ms + 100)).await;
    sweeper_task.shutdown().await;
    ticker.abort();
    let last = match sweeper.run_pass().await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("final sweep: {e}");
            return ExitCode::FAILURE;
        }
    };

    // --- outcome and invariants ---------------------------------------------------------
    let info = match gate.sale_info(SKU).await {
        Ok(Some(i)) => i,
        other => {
            eprintln!("sale info: {other:?}");
            return ExitCode::FAILURE;
        }
    };
    let totals = match ledger.totals(SKU).await {
        Ok(t) => t,
        Err(e) => {
            eprintln!("totals: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut keys: Vec<_> = outcomes.iter().collect();
    keys.sort_by_key(|(k, _)| format!("{k:?}"));
    println!(
        "flash sale: {buyers} buyers, {units} units, TTL {ttl_ms} ms, buyers done in {:.2?}",
        buyers_done
    );
    for (k, v) in keys {
        println!("  {k:?}: {v}");
    }
    println!(
        "ledger: committed {} orders ({} units), pending {}, cancelled {}, cancelled by sweeper {}, refund required {}",
        totals.committed_orders,
        totals.committed_units,
        totals.pending_orders,
        totals.cancelled_orders,
        totals.cancelled_by_sweeper_orders,
        totals.refund_required_orders
    );
    println!(
        "engine: total {} available {} reserved {} committed {} state {}",
        info.total, info.available, info.reserved, info.committed, info.state
    );
    println!("final sweep: {last:?}");

    let checks = [
        ("committed <= units", totals.committed_units <= units),
        (
            "engine committed == ledger COMMITTED",
            info.committed as u64 == totals.committed_units,
        ),
        (
            "available + reserved + committed == total",
            info.available + info.reserved + info.committed == info.total,
        ),
        ("no hold left after the final sweep", info.reserved == 0),
        ("no PENDING order left", totals.pending_orders == 0),
        (
            "available == units - committed (no unit lost or sold twice)",
            info.available as u64 == units - totals.committed_units.min(units),
        ),
        (
            "every late payment refused or REFUND_REQUIRED",
            late_bad == 0,
        ),
        (
            "buyers who paid in time == ledger COMMITTED",
            outcomes.get(&Outcome::Bought).copied().unwrap_or(0) == totals.committed_orders,
        ),
    ];
    let mut ok = true;
    for (name, pass) in checks {
        println!("  [{}] {name}", if pass { "ok" } else { "FAIL" });
        ok &= pass;
    }
    drop(ledger);
    drop(checkout);
    let _ = std::fs::remove_dir_all(&dir);
    if ok {
        println!("invariants hold");
        ExitCode::SUCCESS
    } else {
        println!("INVARIANT VIOLATED");
        ExitCode::FAILURE
    }
}

async fn buyer(
    checkout: &Checkout<SledLedger, EngineGate>,
    keyring: &Keyring,
    i: u64,
    plan: Plan,
    ttl_ms: u64,
    deadline: i64,
) -> Outcome {
    let user = format!("buyer-{i}");
    let admission = keyring.mint(SKU, &user, (now_ms() + 60_000) as u64);
    // Sold out now may mean "come back": abandoned holds return to stock when swept.
    let hold = loop {
        match checkout
            .start(SKU, &user, &admission, &format!("r-{i}"), 1)
            .await
        {
            Ok(h) => break h,
            Err(CheckoutError::SoldOut) if now_ms() < deadline => {
                let wait = rand::thread_rng().gen_range(50..400);
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            Err(CheckoutError::SoldOut) => return Outcome::SoldOut,
            Err(e) => return Outcome::Other(e.to_string()),
        }
    };
    let think = |lo: u64, hi: u64| Duration::from_millis(rand::thread_rng().gen_range(lo..hi));
    match plan {
        Plan::PayInTime => {
            tokio::time::sleep(think(0, ttl_ms / 2)).await;
            match checkout.pay(&hold.token, &format!("pay-{i}"), true).await {
                Ok(PayOutcome::Committed { .. }) | Ok(PayOutcome::AlreadyCommitted) => {
                    Outcome::Bought
                }
                other => Outcome::Other(format!("{other:?}")),
            }
        }
        Plan::PayLate => {
            // After the hold expired: before or after the sweeper got to it.
            let now = now_ms();
            let after = (hold.expires_at_ms - now).max(0) as u64;
            tokio::time::sleep(Duration::from_millis(after) + think(1, 600)).await;
            match checkout.pay(&hold.token, &format!("pay-{i}"), true).await {
                Ok(PayOutcome::RefundRequired { .. }) => Outcome::LateRefundRequired,
                Ok(PayOutcome::Refused { .. }) => Outcome::LateRefused,
                other => Outcome::Other(format!("late: {other:?}")),
            }
        }
        Plan::Cancel => {
            tokio::time::sleep(think(0, ttl_ms / 3)).await;
            match checkout.cancel(&hold.token).await {
                Ok(_) => Outcome::Cancelled,
                Err(e) => Outcome::Other(e.to_string()),
            }
        }
        // Walks away: the sweeper reclaims the hold when it expires.
        Plan::Abandon => Outcome::Abandoned,
    }
}

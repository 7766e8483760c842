//! `stockgate-history-check`: judges a saved history of a flash sale (JSON lines of
//! operation invocations, completions and the final state) against the sale's model, as
//! `stockgate_tools::checker::check` does. Exit 0: no violation; 1: violations, listed;
//! 2: the file could not be read, or a line is no record.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use stockgate_tools::checker;

#[derive(Parser)]
#[command(
    name = "stockgate-history-check",
    version,
    about = "Checks a recorded history of RESERVE/COMMIT/RELEASE/READ operations and the final \
             state of a stockgate sale: no acknowledged write lost, no token reused, no oversell, \
             counters consistent",
    after_help = "FORMAT: JSON lines, one object per line, \"type\" naming the record:\n\
  {\"type\":\"sale\",\"sku\":\"S\",\"total\":300}\n\
  {\"type\":\"invoke\",\"op_id\":7,\"process\":3,\"op\":\"RESERVE\",\"sku\":\"S\",\"user\":\"u1\",\"req\":\"r1\",\"t_ms\":1700000000000}\n\
  {\"type\":\"complete\",\"op_id\":7,\"process\":3,\"result\":\"ok\",\"reply\":\"RESERVED\",\"token\":\"{S}...\",\"t_ms\":1700000000004}\n\
  {\"type\":\"invoke\",\"op_id\":8,\"process\":3,\"op\":\"COMMIT\",\"sku\":\"S\",\"token\":\"{S}...\",\"t_ms\":1700000000005}\n\
  {\"type\":\"complete\",\"op_id\":8,\"process\":3,\"result\":\"unknown\",\"reply\":\"timeout\",\"t_ms\":1700000002005}\n\
  {\"type\":\"final_reservation\",\"sku\":\"S\",\"token\":\"{S}...\",\"state\":\"COMMITTED\"}\n\
  {\"type\":\"final_sale\",\"sku\":\"S\",\"total\":300,\"available\":12,\"reserved\":80,\"committed\":208}\n\n\
op: RESERVE (user, req, optional qty), COMMIT, RELEASE, READ (token; a RESERVATION read).\n\
result: ok (success), fail (answered, changed nothing: SOLDOUT, READONLY, LOADING, RELEASED...),\n\
unknown (timeout, connection lost: may or may not have taken effect; also an invoke with no\n\
complete). reply: RESERVED/REPLAY (with token) for RESERVE, 1/0 for COMMIT and RELEASE, the\n\
state or nil for READ, the reply word for a fail. final_reservation: RESERVATION's state on\n\
the final leader (null if unknown to it); final_sale: its SALE.INFO.\n\n\
EXIT STATUS: 0 no violation, 1 violations (listed; an inconsistent history, such as a\n\
complete without its invoke, is one), 2 unreadable file or a line that is no record."
)]
struct Cli {
    /// The history file (JSON lines).
    file: PathBuf,
    /// Print only the violations, not the counts.
    #[arg(long, short)]
    quiet: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let records = match checker::load(&cli.file) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stockgate-history-check: {e}");
            return ExitCode::from(2);
        }
    };
    let report = checker::check(&records);
    if cli.quiet {
        for v in &report.violations {
            println!("{v}");
        }
    } else {
        print!("{report}");
    }
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

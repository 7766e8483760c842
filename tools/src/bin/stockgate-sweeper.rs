//! `stockgate-sweeper`: the old name of `stockgate-ops`, kept so that existing scripts,
//! systemd units and tests that run it by that name go on working. The same program: this
//! binary compiles the same file.

#[path = "stockgate-ops.rs"]
mod ops;

fn main() -> std::process::ExitCode {
    ops::main()
}

//! Loopback ports for processes a test starts on a port it names, and restarts on the
//! same port.
//!
//! A port learnt by binding port 0 and letting go of it lies in the kernel's ephemeral
//! range: until the server binds it, any other bind to port 0 in the machine may be given
//! it, and so may any outgoing connection; and a server restarted after a `kill -9`
//! leaves it free again for the same. Two tests running side by side then talk to each
//! other's servers (they share the key files' contents), which looks like lost or
//! doubled writes. The ports handed out here lie below the ephemeral range, where the
//! kernel never picks on its own, and each is handed out once per process.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out: well above the registered services a test machine runs.
const FLOOR: u32 = 12_000;
/// Where the kernel's ephemeral range starts when `/proc` does not say.
const EPHEMERAL_DEFAULT: u32 = 32_768;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A loopback port no other test of this process was given, free when asked, and outside
/// the range the kernel picks from for port 0 and outgoing connections. Falls back to
/// the kernel's pick (port 0) only when the machine leaves no room below that range.
pub fn reserve() -> std::io::Result<u16> {
    let top = ephemeral_low().unwrap_or(EPHEMERAL_DEFAULT).min(65_536);
    if top <= FLOOR + 1_000 {
        return kernel_pick();
    }
    let span = top - FLOOR;
    // Processes started one after the other begin at different places, so a server left
    // over from an earlier one (or a second suite on the machine) is met rarely; the
    // bind below skips it when it is.
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = FLOOR + (start + n) % span;
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    kernel_pick()
}

fn kernel_pick() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The first port of the kernel's ephemeral range (Linux), if it can be read.
fn ephemeral_low() -> Option<u32> {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_below_the_ephemeral_range() {
        let low = ephemeral_low().unwrap_or(EPHEMERAL_DEFAULT);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..500 {
            let p = reserve().expect("a port");
            assert!(seen.insert(p), "port {p} handed out twice");
            if low > FLOOR + 1_000 {
                assert!(u32::from(p) >= FLOOR && u32::from(p) < low, "port {p}");
            }
        }
    }
}

//! Loopback ports for the processes a test starts (`rewire run`,
//! `redis-server`, `etcd`), which bind them only after they are picked.
//!
//! A port picked by binding port 0 and letting go lies in the kernel's
//! ephemeral range, where any other socket's `bind(0)` or outgoing
//! connection may take it before the child binds it (`cannot listen on …:
//! Address in use`). So ports are handed out from below that range, where
//! the kernel never picks one itself: each once per process, from blocks
//! claimed against other processes (test binaries run side by side) by an
//! abstract Unix socket, which the kernel lets go when the process ends. A
//! port something already listens on is skipped. Where that is not
//! available (not Linux, or no room below the range), the kernel picks.

use std::sync::Mutex;

/// Ports handed out per claimed block.
const BLOCK: u16 = 50;
/// Ports in the window below the ephemeral range.
const WINDOW: u16 = 10_000;
/// Room kept between the window and the ephemeral range, so that a port
/// plus 10 000 (a redis cluster node's bus port) is below the range too.
const ROOM: u16 = 10_000;
/// The lowest port the window may start at (below it, system services).
const LOWEST: u16 = 1024;

/// The ports of the block this process hands out from, and the claims it
/// holds (for its lifetime: a child may bind its port at any time).
struct Blocks {
    next: u16,
    end: u16,
    #[cfg(target_os = "linux")]
    claims: Vec<std::os::unix::net::UnixListener>,
}

static BLOCKS: Mutex<Blocks> = Mutex::new(Blocks {
    next: 0,
    end: 0,
    #[cfg(target_os = "linux")]
    claims: Vec::new(),
});

/// A loopback port nobody listens on, handed out once per process and to
/// no other process using this crate, outside the kernel's ephemeral
/// range (see the module docs); else one the kernel picks.
pub fn free_port() -> u16 {
    let Some(window) = window() else {
        return kernel_pick();
    };
    let mut blocks = BLOCKS.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if blocks.next >= blocks.end && !blocks.claim_next(window) {
            return kernel_pick();
        }
        let port = blocks.next;
        blocks.next += 1;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

impl Blocks {
    /// Claims a block of `window` no process holds; false when all are held.
    #[cfg(target_os = "linux")]
    fn claim_next(&mut self, window: u16) -> bool {
        let count = WINDOW / BLOCK;
        // Processes start their search at different blocks.
        let first = (std::process::id() % u32::from(count)) as u16;
        for step in 0..count {
            let index = (first + step) % count;
            if let Some(claim) = claim(window, index) {
                self.claims.push(claim);
                self.next = window + index * BLOCK;
                self.end = self.next + BLOCK;
                return true;
            }
        }
        false
    }

    #[cfg(not(target_os = "linux"))]
    fn claim_next(&mut self, _window: u16) -> bool {
        false
    }
}

/// The abstract socket holding block `index` of the window at `window`,
/// if no process holds it.
#[cfg(target_os = "linux")]
fn claim(window: u16, index: u16) -> Option<std::os::unix::net::UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    let name = claim_name(window, index);
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
    UnixListener::bind_addr(&addr).ok()
}

/// The abstract socket name of block `index`.
fn claim_name(window: u16, index: u16) -> String {
    format!("rewire-testkit-ports-{window}-{index}")
}

/// The first port of the window, when the ephemeral range leaves room for
/// it below.
fn window() -> Option<u16> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let lowest_ephemeral = ephemeral_range()?.0;
    let start = lowest_ephemeral.checked_sub(ROOM)?.checked_sub(WINDOW)?;
    (start >= LOWEST).then_some(start)
}

/// The kernel's ephemeral port range (`ip_local_port_range`).
fn ephemeral_range() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut bounds = text.split_whitespace().map(|n| n.parse::<u16>().ok());
    Some((bounds.next()??, bounds.next()??))
}

/// A port the kernel picks (bound to port 0, then let go).
fn kernel_pick() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_never_handed_out_twice() {
        let (lowest, _) = ephemeral_range().expect("ip_local_port_range");
        let window = window().expect("room below the ephemeral range");
        // More than a block: the next block is claimed on the way.
        let ports: Vec<u16> = (0..3 * BLOCK).map(|_| free_port()).collect();
        let distinct: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port handed out twice");
        for port in ports {
            assert!(
                (window..window + WINDOW).contains(&port) && port + ROOM < lowest,
                "{port} may be taken by the kernel for another socket (ephemeral from {lowest})"
            );
        }
    }

    #[test]
    fn a_block_handed_out_from_cannot_be_claimed_by_another_process() {
        let port = free_port();
        let window = window().expect("room below the ephemeral range");
        let index = (port - window) / BLOCK;
        // Abstract socket names are one namespace for every process: the
        // same bind from another process fails as this one does.
        assert!(
            claim(window, index).is_none(),
            "block {index} ({}) was claimable while handed out from",
            claim_name(window, index)
        );
    }
}

//! Which aggregator to ship to, sans IO: the addresses of `ship.aggregators` (each name's every
//! DNS record), a starting place spread over a fleet by the agent id, and the move to the next
//! address on a failure.
//!
//! An agent starts at the address its agent id's hash picks, so that a fleet with one list
//! spreads over it, and stays there while batches are stored. On a failure (no connection, a
//! lost connection, a batch refused as `unavailable`) it moves to the next address at once; only
//! when every address of the list failed in turn, with no batch stored in between, does the
//! shipper back off before going round again.

use std::net::SocketAddr;

/// One address to ship to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The `host:port` of the list it comes from: its host is the TLS server name unless
    /// `ship.server-name` is set.
    pub entry: String,
    /// One address that entry resolved to.
    pub addr: SocketAddr,
}

/// What to do after a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Try the next address now: it has not failed in this pass.
    Now,
    /// Every address failed in this pass: back off, resolve the list again, start a new pass.
    Backoff,
}

/// The addresses and where the agent is among them.
#[derive(Clone, Debug)]
pub struct Rotation {
    targets: Vec<Target>,
    current: usize,
    /// Addresses that failed since the last batch was stored.
    failed: usize,
    /// The agent id's hash: its starting place.
    start: u64,
}

impl Rotation {
    /// An empty rotation for the agent `agent_id`; [`Rotation::update`] fills it.
    pub fn new(agent_id: &str) -> Rotation {
        Rotation {
            targets: Vec::new(),
            current: 0,
            failed: 0,
            start: fnv1a(agent_id.as_bytes()),
        }
    }

    /// Takes the addresses the list resolved to now, in list order, each entry's addresses
    /// sorted (a DNS server may answer in any order) and duplicates dropped. The current address
    /// stays current if it is still there; else the agent starts at its own place.
    pub fn update(&mut self, targets: Vec<Target>) {
        let mut sorted: Vec<Target> = Vec::with_capacity(targets.len());
        let mut from = 0;
        for target in targets {
            if sorted.iter().any(|t| t.addr == target.addr) {
                continue;
            }
            if sorted.last().is_some_and(|last| last.entry != target.entry) {
                from = sorted.len();
            }
            sorted.push(target);
            sorted[from..].sort_by_key(|t| t.addr);
        }
        let current = self.current().map(|t| t.addr);
        self.targets = sorted;
        self.current =
            match current.and_then(|addr| self.targets.iter().position(|t| t.addr == addr)) {
                Some(index) => index,
                None if self.targets.is_empty() => 0,
                None => (self.start % self.targets.len() as u64) as usize,
            };
    }

    /// The address to ship to; `None` before the first [`Rotation::update`] with addresses.
    pub fn current(&self) -> Option<&Target> {
        self.targets.get(self.current)
    }

    /// How many addresses there are.
    pub fn len(&self) -> usize {
        self.targets.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// The current address failed: moves to the next one, and says whether to try it now or
    /// to back off first (every address failed since a batch was last stored; a new pass
    /// starts).
    pub fn failed(&mut self) -> Next {
        if self.targets.is_empty() {
            return Next::Backoff;
        }
        self.current = (self.current + 1) % self.targets.len();
        self.failed += 1;
        if self.failed >= self.targets.len() {
            self.failed = 0;
            Next::Backoff
        } else {
            Next::Now
        }
    }

    /// A batch was stored through the current address: a failure after this starts a new pass.
    pub fn stored(&mut self) {
        self.failed = 0;
    }
}

/// FNV-1a, 64 bits: a hash that stays the same across builds and platforms, so that an agent
/// starts at the same address after an upgrade.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(entry: &str, addr: &str) -> Target {
        Target {
            entry: entry.to_owned(),
            addr: addr.parse().unwrap(),
        }
    }

    fn three() -> Vec<Target> {
        vec![
            target("a:4041", "10.0.0.1:4041"),
            target("b:4041", "10.0.0.2:4041"),
            target("c:4041", "10.0.0.3:4041"),
        ]
    }

    fn rotation(agent_id: &str, targets: Vec<Target>) -> Rotation {
        let mut rotation = Rotation::new(agent_id);
        rotation.update(targets);
        rotation
    }

    #[test]
    fn agents_start_spread_over_the_list_and_always_at_the_same_place() {
        let mut starts = [0usize; 3];
        for i in 0..300 {
            let id = format!("agent-{i}");
            let first = rotation(&id, three()).current().unwrap().addr;
            assert_eq!(
                rotation(&id, three()).current().unwrap().addr,
                first,
                "stable"
            );
            starts[three().iter().position(|t| t.addr == first).unwrap()] += 1;
        }
        assert!(starts.iter().all(|&n| n >= 60), "spread: {starts:?}");
        // The hash is FNV-1a, not the standard library's, which may change between releases.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn failures_move_on_at_once_until_every_address_failed() {
        let mut rotation = rotation("agent", three());
        let first = rotation.current().unwrap().addr;
        assert_eq!(rotation.failed(), Next::Now);
        let second = rotation.current().unwrap().addr;
        assert_ne!(second, first);
        assert_eq!(rotation.failed(), Next::Now);
        let third = rotation.current().unwrap().addr;
        assert!(third != first && third != second);
        assert_eq!(
            rotation.failed(),
            Next::Backoff,
            "all three failed: back off"
        );
        assert_eq!(rotation.current().unwrap().addr, first, "round again");
        assert_eq!(rotation.failed(), Next::Now, "a new pass");
    }

    #[test]
    fn a_stored_batch_starts_a_new_pass() {
        let mut rotation = rotation("agent", three());
        assert_eq!(rotation.failed(), Next::Now);
        assert_eq!(rotation.failed(), Next::Now);
        rotation.stored();
        // The third address works for a while, then fails: the two others are tried at once.
        assert_eq!(rotation.failed(), Next::Now);
        assert_eq!(rotation.failed(), Next::Now);
        assert_eq!(rotation.failed(), Next::Backoff);
    }

    #[test]
    fn one_address_backs_off_at_each_failure() {
        let mut rotation = rotation("agent", vec![target("a:4041", "10.0.0.1:4041")]);
        assert_eq!(rotation.failed(), Next::Backoff);
        assert_eq!(rotation.failed(), Next::Backoff);
        assert_eq!(
            rotation.current().unwrap().addr.to_string(),
            "10.0.0.1:4041"
        );
        assert_eq!(Rotation::new("agent").failed(), Next::Backoff, "none yet");
    }

    #[test]
    fn a_name_with_several_records_counts_as_several_in_a_stable_order() {
        let records = |order: &[&str]| -> Vec<Target> {
            let mut targets: Vec<Target> = order.iter().map(|a| target("aggs:4041", a)).collect();
            targets.push(target("solo:4041", "10.0.1.1:4041"));
            targets
        };
        let a = rotation(
            "agent",
            records(&["10.0.0.3:4041", "10.0.0.1:4041", "10.0.0.2:4041"]),
        );
        let b = rotation(
            "agent",
            records(&["10.0.0.2:4041", "10.0.0.3:4041", "10.0.0.1:4041"]),
        );
        assert_eq!(a.len(), 4);
        assert_eq!(a.targets, b.targets, "DNS order does not matter");
        assert_eq!(a.targets[0].addr.to_string(), "10.0.0.1:4041");
        assert_eq!(a.targets[3].entry, "solo:4041", "list order kept");
        let dup = rotation(
            "agent",
            vec![target("x:1", "10.0.0.1:1"), target("y:1", "10.0.0.1:1")],
        );
        assert_eq!(dup.len(), 1, "one address listed twice is one");
    }

    #[test]
    fn a_new_resolution_keeps_the_current_address() {
        let mut rotation = rotation("agent", three());
        rotation.failed();
        let current = rotation.current().unwrap().clone();
        let mut fewer = three();
        fewer.retain(|t| t.addr == current.addr || t.entry == "a:4041");
        rotation.update(fewer);
        assert_eq!(rotation.current(), Some(&current));
        // Gone from DNS: back to the agent's own place among what is left.
        rotation.update(vec![target("d:4041", "10.0.0.9:4041")]);
        assert_eq!(rotation.current().unwrap().entry, "d:4041");
        rotation.update(Vec::new());
        assert!(rotation.is_empty() && rotation.current().is_none());
    }
}

//! Network namespaces for tests of what crosses a network: a namespace joined to this one by a
//! veth pair, whose link a test can cut and heal (a partition between a process inside and
//! everything outside); and a bridge joining several namespaces into one network, as hosts on
//! one switch, each host's port cut and healed on its own. Needs root and `ip` (iproute2).
//!
//! Each pair gets its own /30 in 10.201.0.0/16 from the test process's id and a counter, so
//! that test binaries running at once do not collide; a bridge its own /24 in 10.202.0.0/16
//! the same way. Dropping the [`Netns`] (also when a test panics) deletes the pair and the
//! namespace; a namespace left by a test process killed outright carries that process's id in
//! its name (`smolder-part-<pid>-<k>`), and the next [`Netns::create`] deletes it once that
//! process is gone (its veth pair goes with it). Dropping a [`Bridge`] deletes it; one left by a
//! killed test has a name the next test of that number deletes before making its own.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Numbers each test process's pairs and bridges apart from another process's.
fn next_number() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let k = NEXT.fetch_add(1, Ordering::Relaxed);
    (std::process::id() * 8 + k) % (1 << 14)
}

/// A namespace and the veth pair into it.
pub struct Netns {
    name: String,
    host_link: String,
    /// This side's address on the pair.
    pub host: Ipv4Addr,
    /// The namespace's address on the pair.
    pub inside: Ipv4Addr,
}

fn ip(args: &[&str]) {
    let output = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("running ip {args:?} (iproute2): {err}"));
    assert!(
        output.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

impl Netns {
    /// Creates the namespace, the pair, both addresses, and brings everything up.
    ///
    /// # Panics
    ///
    /// When `ip` fails (not root, no iproute2).
    pub fn create() -> Netns {
        sweep();
        let n = next_number();
        let name = format!("smolder-part-{}-{n}", std::process::id());
        let host_link = format!("smp{n}h");
        let inside_link = format!("smp{n}n");
        let base = n * 4;
        let octets = |last: u32| {
            Ipv4Addr::new(
                10,
                201,
                u8::try_from(base >> 8).expect("14 bits of n leave 8 for this octet"),
                u8::try_from((base & 0xff) + last).expect("a /30 ends before 256"),
            )
        };
        let (host, inside) = (octets(1), octets(2));
        ip(&["netns", "add", &name]);
        let netns = Netns {
            name,
            host_link,
            host,
            inside,
        };
        netns.veth(&netns.host_link, &inside_link, &format!("{inside}/30"));
        ip(&[
            "addr",
            "add",
            &format!("{host}/30"),
            "dev",
            &netns.host_link,
        ]);
        ip(&["link", "set", &netns.host_link, "up"]);
        ip(&["-n", &netns.name, "link", "set", "lo", "up"]);
        netns
    }

    /// A veth pair from this namespace into this one, its inner end `inside_link` addressed
    /// `inside` (CIDR) and up; the outer end `host_link` is left to the caller. A pair of that
    /// name left by a killed run goes first.
    fn veth(&self, host_link: &str, inside_link: &str, inside: &str) {
        let _ = Command::new("ip").args(["link", "del", host_link]).output();
        ip(&[
            "link",
            "add",
            host_link,
            "type",
            "veth",
            "peer",
            "name",
            inside_link,
            "netns",
            &self.name,
        ]);
        ip(&["-n", &self.name, "addr", "add", inside, "dev", inside_link]);
        ip(&["-n", &self.name, "link", "set", inside_link, "up"]);
    }

    /// The command line that runs a program inside: `ip netns exec <name>`.
    pub fn exec(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.name]
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    }

    /// Cuts the link: this side's end goes down, and both ends lose carrier.
    pub fn cut(&self) {
        ip(&["link", "set", &self.host_link, "down"]);
    }

    /// Heals it.
    pub fn heal(&self) {
        ip(&["link", "set", &self.host_link, "up"]);
    }
}

/// A bridge in this namespace, with an address of its own, joining namespaces into one /24:
/// hosts on one switch, which reach each other (and this namespace) by their [`Port`]s'
/// addresses.
pub struct Bridge {
    name: String,
    number: u32,
    /// This namespace's address on it (`.1`).
    pub host: Ipv4Addr,
}

/// A namespace's place on a [`Bridge`]: a veth pair whose outer end is in the bridge.
pub struct Port {
    host_link: String,
    /// The namespace's address on the bridge.
    pub addr: Ipv4Addr,
}

impl Bridge {
    /// Creates the bridge and its address, up.
    ///
    /// # Panics
    ///
    /// When `ip` fails (not root, no iproute2).
    pub fn create() -> Bridge {
        let number = next_number();
        let name = format!("smb{number}");
        // A bridge left by a killed run with the same number goes first.
        let _ = Command::new("ip").args(["link", "del", &name]).output();
        ip(&["link", "add", &name, "type", "bridge"]);
        let bridge = Bridge {
            host: Bridge::address(number, 1),
            name,
            number,
        };
        ip(&[
            "addr",
            "add",
            &format!("{}/24", bridge.host),
            "dev",
            &bridge.name,
        ]);
        ip(&["link", "set", &bridge.name, "up"]);
        bridge
    }

    /// Address `.host` of bridge `number`'s /24.
    fn address(number: u32, host: u8) -> Ipv4Addr {
        let subnet = u8::try_from(number % 256).expect("below 256");
        Ipv4Addr::new(10, 202, subnet, host)
    }

    /// Puts `netns` on the bridge as host `.host` (2 to 254).
    ///
    /// # Panics
    ///
    /// When `host` is outside 2..=254, or `ip` fails (the host is on this bridge already).
    pub fn attach(&self, netns: &Netns, host: u8) -> Port {
        assert!((2..=254).contains(&host), "host .{host} of a /24");
        let host_link = format!("sb{}h{host}", self.number);
        let inside_link = format!("sb{}n{host}", self.number);
        let addr = Bridge::address(self.number, host);
        netns.veth(&host_link, &inside_link, &format!("{addr}/24"));
        ip(&["link", "set", &host_link, "master", &self.name]);
        ip(&["link", "set", &host_link, "up"]);
        Port { host_link, addr }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.name])
            .output();
    }
}

impl Port {
    /// Cuts the host off the bridge: its end in the bridge goes down.
    pub fn cut(&self) {
        ip(&["link", "set", &self.host_link, "down"]);
    }

    /// Puts it back.
    pub fn heal(&self) {
        ip(&["link", "set", &self.host_link, "up"]);
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // Deleting one end deletes the pair (gone already when its namespace was deleted).
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_link])
            .output();
    }
}

/// Deletes the namespaces of test processes that no longer run.
fn sweep() {
    let Ok(output) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let owner = name
            .strip_prefix("smolder-part-")
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok());
        if let Some(pid) = owner
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting one end deletes the pair.
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_link])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn namespaces() -> String {
        let output = Command::new("ip").args(["netns", "list"]).output().unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn link_exists(link: &str) -> bool {
        Command::new("ip")
            .args(["link", "show", link])
            .output()
            .unwrap()
            .status
            .success()
    }

    #[test]
    fn a_test_that_panics_leaves_neither_namespace_nor_pair() {
        let mut made = None;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let netns = Netns::create();
            made = Some((netns.name.clone(), netns.host_link.clone()));
            assert!(namespaces().contains(&netns.name));
            assert!(link_exists(&netns.host_link));
            panic!("a failing test");
        }));
        assert!(result.is_err());
        let (name, link) = made.unwrap();
        assert!(!namespaces().contains(&name), "{name} is left");
        assert!(!link_exists(&link), "{link} is left");
    }

    #[test]
    fn a_namespace_of_a_process_that_is_gone_is_deleted() {
        // Above the kernel's largest pid_max (2^22): no process has it.
        let stale = "smolder-part-99999999-0";
        ip(&["netns", "add", stale]);
        let netns = Netns::create();
        assert!(!namespaces().contains(stale), "{stale} is left");
        assert!(namespaces().contains(&netns.name));
    }

    /// A listener inside `netns` on `addr`, port 0, accepting connections until killed; its
    /// port.
    fn listener_in(netns: &Netns, addr: Ipv4Addr) -> (std::process::Child, u16) {
        use std::io::BufRead;
        let script = format!(
            "import socket,sys\ns=socket.socket()\ns.bind(('{addr}',0))\ns.listen()\n\
             print(s.getsockname()[1],flush=True)\nwhile True: s.accept()[0].close()"
        );
        let mut child = Command::new("ip")
            .args(["netns", "exec", &netns.name, "python3", "-c", &script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        (child, line.trim().parse().unwrap())
    }

    fn reaches(addr: Ipv4Addr, port: u16) -> bool {
        let target = std::net::SocketAddr::from((addr, port));
        std::net::TcpStream::connect_timeout(&target, std::time::Duration::from_millis(500)).is_ok()
    }

    #[test]
    fn hosts_on_a_bridge_reach_each_other_until_a_port_is_cut() {
        let bridge = Bridge::create();
        let (a, b) = (Netns::create(), Netns::create());
        let (port_a, port_b) = (bridge.attach(&a, 2), bridge.attach(&b, 3));
        let (mut server, port) = listener_in(&b, port_b.addr);
        // From this namespace, over the bridge's own address.
        assert!(reaches(port_b.addr, port));
        // From the other host: a connection made inside `a`.
        let from_a = |addr: Ipv4Addr| {
            Command::new("ip")
                .args(["netns", "exec", &a.name, "python3", "-c"])
                .arg(format!(
                    "import socket; socket.create_connection(('{addr}', {port}), timeout=0.5)"
                ))
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap()
                .success()
        };
        assert!(from_a(port_b.addr));
        port_b.cut();
        assert!(!reaches(port_b.addr, port));
        assert!(!from_a(port_b.addr));
        port_b.heal();
        assert!(from_a(port_b.addr));
        server.kill().unwrap();
        server.wait().unwrap();
        let links = [port_a.host_link.clone(), bridge.name.clone()];
        drop((port_a, port_b, a, b, bridge));
        for link in links {
            assert!(!link_exists(&link), "{link} is left");
        }
    }
}

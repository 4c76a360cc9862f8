//! A real Garage server (a distributed S3-compatible store, crates.io `garage`) for the tests of
//! object-storage mode: [`Garage`], one node on loopback with its own directories, a bucket and
//! an access key; [`Cluster`], several nodes, each in a network namespace of its own on one
//! [`Bridge`], replicating every object to each, for the multi-host test.
//!
//! Garage takes fixed ports from its config file, so [`Garage::start`] picks free ones by
//! binding port 0 and releasing it (and starts again on other ports if one was taken
//! meanwhile); a [`Cluster`]'s nodes use Garage's usual ports, each in a namespace where
//! nothing else listens. The binary is Garage 2.5.0 as `scripts/test` installs it
//! (`cargo install garage --version 2.5.0 --locked`); [`binary`] finds it on `PATH` or in
//! Cargo's bin directory and fails, naming that command, when it is missing.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::netns::{Bridge, Netns, Port};
use crate::process::Process;

/// The Garage release the tests are written against.
pub const VERSION: &str = "2.5.0";

/// The region Garage answers for (its config's `s3_region`).
pub const REGION: &str = "garage";

/// The Garage binary: `garage` on `PATH`, else `$CARGO_HOME/bin/garage` (`~/.cargo/bin`).
///
/// # Panics
///
/// When there is none, with the command that installs it.
pub fn binary() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("garage"))
            .find(|candidate| candidate.is_file())
    });
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")));
    on_path
        .or_else(|| {
            cargo_home
                .map(|home| home.join("bin").join("garage"))
                .filter(|candidate| candidate.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "the object-storage tests need Garage {VERSION}, which is not installed: run \
                 `cargo install garage --version {VERSION} --locked` (scripts/test does)"
            )
        })
}

/// A running single-node Garage with one bucket and one key allowed to use it; killed (and its
/// directories deleted) when dropped.
pub struct Garage {
    node: Node,
    /// The S3 endpoint, `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The key's id.
    pub key_id: String,
    /// The key's secret.
    pub secret: String,
    /// The bucket made at start.
    pub bucket: String,
    _dir: tempfile::TempDir,
}

impl Garage {
    /// Starts a node, lays it out, creates bucket `bucket` and a key that may read and write it.
    ///
    /// # Panics
    ///
    /// When Garage is not installed, or does not come up within a minute.
    pub fn start(bucket: &str) -> Garage {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut attempt = 0;
        let (node, endpoint) = loop {
            attempt += 1;
            let [s3, rpc, admin] = free_ports();
            let mut node = Node {
                wrapper: Vec::new(),
                config: dir.path().join("garage.toml"),
                process: None,
                s3,
            };
            std::fs::write(&node.config, config_file(dir.path(), 1, s3, rpc, admin))
                .expect("writing garage.toml");
            match node.start() {
                Ok(()) => break (node, format!("http://{s3}")),
                // A port taken between its release and Garage's bind: start again elsewhere.
                Err(log) if attempt < 3 && log.contains("in use") => continue,
                Err(log) => panic!("garage did not start:\n{log}"),
            }
        };
        let id = node.id();
        node.run(&["layout", "assign", "-z", "dc1", "-c", "1G", &id]);
        node.run(&["layout", "apply", "--version", "1"]);
        let (key_id, secret) = node.bucket_and_key(bucket);
        node.wait_for_s3();
        Garage {
            node,
            endpoint,
            key_id,
            secret,
            bucket: bucket.to_owned(),
            _dir: dir,
        }
    }

    /// Runs `garage` with these arguments against this node; its standard output.
    ///
    /// # Panics
    ///
    /// When the command fails.
    pub fn cli(&self, args: &[&str]) -> String {
        self.node.run(args)
    }

    /// The `store.object-store` section of an aggregator's config for this node's bucket (YAML,
    /// indented for its place under `store:`), with `extra` lines appended as they are.
    pub fn store_yaml(&self, extra: &str) -> String {
        store_yaml(
            &self.bucket,
            &self.endpoint,
            &self.key_id,
            &self.secret,
            extra,
        )
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        self.node.log()
    }

    /// Stops it at once (SIGKILL), as a crash or a lost machine would.
    pub fn kill(&mut self) {
        self.node.kill();
    }

    /// Starts it again after [`Garage::kill`], on the same ports and directories (its layout,
    /// bucket, key and objects as they were).
    ///
    /// # Panics
    ///
    /// When it is running, or does not come back within a minute.
    pub fn restart(&mut self) {
        self.node.restart();
    }

    /// Stops it answering (SIGSTOP), as a bucket that has become slow: connections are still
    /// accepted by the kernel, requests wait for an answer that does not come until
    /// [`Garage::resume`], which then answers those still waiting.
    ///
    /// # Panics
    ///
    /// When it is not running.
    pub fn pause(&self) {
        self.node.process().signal("STOP");
    }

    /// Lets it answer again after [`Garage::pause`].
    ///
    /// # Panics
    ///
    /// When it is not running.
    pub fn resume(&self) {
        self.node.process().signal("CONT");
    }
}

/// A running Garage cluster: nodes each in a network namespace of its own on one [`Bridge`],
/// each in a zone of its own, every object stored on every node (replication factor = nodes), one
/// bucket and one key allowed to use it. Aggregators on the bridge reach node `k`'s S3 API at
/// [`Cluster::endpoint`]; with three nodes, writes and reads need two (Garage's quorums), so the
/// bucket stays usable with any one node down. Killed (its namespaces and directories deleted)
/// when dropped.
pub struct Cluster {
    nodes: Vec<(Node, Port, Netns)>,
    /// The key's id.
    pub key_id: String,
    /// The key's secret.
    pub secret: String,
    /// The bucket made at start.
    pub bucket: String,
    _dir: tempfile::TempDir,
}

/// The ports of a cluster's node, inside its own namespace.
const S3_PORT: u16 = 3900;
const RPC_PORT: u16 = 3901;
const ADMIN_PORT: u16 = 3903;

impl Cluster {
    /// Starts `count` nodes on `bridge` as hosts `.first`, `.first + 1`, …, connects and lays
    /// them out, and creates bucket `bucket` and a key that may read and write it.
    ///
    /// # Panics
    ///
    /// When Garage is not installed, a node does not come up within a minute, or the cluster
    /// does not take the bucket within a minute.
    pub fn start(bridge: &Bridge, first: u8, count: u8, bucket: &str) -> Cluster {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut nodes = Vec::new();
        for k in 0..count {
            let netns = Netns::create();
            let port = bridge.attach(&netns, first + k);
            let home = dir.path().join(format!("node{k}"));
            std::fs::create_dir_all(&home).expect("a node's directory");
            let (s3, rpc, admin) = (
                SocketAddr::from((port.addr, S3_PORT)),
                SocketAddr::from((port.addr, RPC_PORT)),
                SocketAddr::from((port.addr, ADMIN_PORT)),
            );
            let mut node = Node {
                wrapper: netns.exec(),
                config: home.join("garage.toml"),
                process: None,
                s3,
            };
            std::fs::write(
                &node.config,
                config_file(&home, usize::from(count), s3, rpc, admin),
            )
            .expect("writing garage.toml");
            if let Err(log) = node.start() {
                panic!("garage node {k} did not start:\n{log}");
            }
            nodes.push((node, port, netns));
        }
        let first_node = &nodes[0].0;
        let ids: Vec<String> = nodes.iter().map(|(node, _, _)| node.id()).collect();
        for ((_, port, _), id) in nodes.iter().zip(&ids).skip(1) {
            first_node.run(&["node", "connect", &format!("{id}@{}:{RPC_PORT}", port.addr)]);
        }
        for (k, id) in ids.iter().enumerate() {
            let zone = format!("dc{}", k + 1);
            first_node.run(&["layout", "assign", "-z", &zone, "-c", "1G", id]);
        }
        first_node.run(&["layout", "apply", "--version", "1"]);
        let (key_id, secret) = first_node.bucket_and_key(bucket);
        for (node, _, _) in &nodes {
            node.wait_for_s3();
        }
        Cluster {
            nodes,
            key_id,
            secret,
            bucket: bucket.to_owned(),
            _dir: dir,
        }
    }

    /// Node `k`'s S3 endpoint, `http://<its address on the bridge>:3900`.
    pub fn endpoint(&self, k: usize) -> String {
        format!("http://{}", self.nodes[k].0.s3)
    }

    /// The `store.object-store` section of an aggregator's config for the bucket through node
    /// `k` (YAML, indented for its place under `store:`), with `extra` lines appended.
    pub fn store_yaml(&self, k: usize, extra: &str) -> String {
        store_yaml(
            &self.bucket,
            &self.endpoint(k),
            &self.key_id,
            &self.secret,
            extra,
        )
    }

    /// Node `k`'s log so far.
    pub fn log(&self, k: usize) -> String {
        self.nodes[k].0.log()
    }

    /// Stops node `k` at once (SIGKILL), as a crash or a lost machine would.
    pub fn kill(&mut self, k: usize) {
        self.nodes[k].0.kill();
    }

    /// Starts node `k` again after [`Cluster::kill`], on its directories.
    ///
    /// # Panics
    ///
    /// When it is running, or does not come back within a minute.
    pub fn restart(&mut self, k: usize) {
        self.nodes[k].0.restart();
    }
}

/// One Garage server: its config, the command line it runs under (`ip netns exec …` for a
/// node in a namespace) and, while it runs, its process.
struct Node {
    wrapper: Vec<String>,
    config: PathBuf,
    process: Option<Process>,
    s3: SocketAddr,
}

impl Node {
    /// `garage -c <config> args`, under the wrapper.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = match self.wrapper.split_first() {
            Some((program, wrapper)) => {
                let mut command = Command::new(program);
                command.args(wrapper).arg(binary());
                command
            }
            None => Command::new(binary()),
        };
        command.arg("-c").arg(&self.config).args(args);
        command
    }

    /// Runs the CLI with these arguments against this node; its standard output.
    ///
    /// # Panics
    ///
    /// When the command fails.
    fn run(&self, args: &[&str]) -> String {
        let output = self.command(args).output().expect("running garage");
        assert!(
            output.status.success(),
            "garage {}: {}\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Starts the server and waits until it answers its CLI over RPC; the server's log when it
    /// exits or a minute passes first.
    fn start(&mut self) -> Result<(), String> {
        let mut command = self.command(&["server"]);
        command.env("RUST_LOG", "garage=warn");
        let process = Process::spawn(command);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = self
                .command(&["status"])
                .output()
                .expect("running garage status");
            if status.status.success() {
                self.process = Some(process);
                return Ok(());
            }
            let log = process.log();
            if log.contains("in use") || Instant::now() > deadline {
                return Err(format!(
                    "{log}\n(garage status: {})",
                    String::from_utf8_lossy(&status.stderr)
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Its node id.
    fn id(&self) -> String {
        let id = self.run(&["node", "id", "-q"]);
        id.trim()
            .split('@')
            .next()
            .expect("split has a first")
            .to_owned()
    }

    /// Creates `bucket` and key `smolder-test` allowed to read and write it: the key's id and
    /// secret. Tried again for a minute while the cluster settles its new layout.
    fn bucket_and_key(&self, bucket: &str) -> (String, String) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let settled = |args: &[&str]| loop {
            let output = self.command(args).output().expect("running garage");
            if output.status.success() {
                break String::from_utf8_lossy(&output.stdout).into_owned();
            }
            assert!(
                Instant::now() < deadline,
                "garage {}: {}\n{}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            std::thread::sleep(Duration::from_millis(500));
        };
        settled(&["bucket", "create", bucket]);
        let key = settled(&["key", "create", "smolder-test"]);
        let field = |name: &str| {
            key.lines()
                .find_map(|line| line.trim().strip_prefix(name))
                .map(|value| value.trim_start_matches(':').trim().to_owned())
                .unwrap_or_else(|| panic!("no {name} in `garage key create`'s output:\n{key}"))
        };
        let (key_id, secret) = (field("Key ID"), field("Secret key"));
        settled(&[
            "bucket",
            "allow",
            "--read",
            "--write",
            "--owner",
            bucket,
            "--key",
            "smolder-test",
        ]);
        (key_id, secret)
    }

    fn log(&self) -> String {
        self.process.as_ref().map(Process::log).unwrap_or_default()
    }

    /// Its process, while it runs.
    fn process(&self) -> &Process {
        self.process.as_ref().expect("garage is running")
    }

    fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    fn restart(&mut self) {
        assert!(self.process.is_none(), "garage is running");
        if let Err(log) = self.start() {
            panic!("garage did not start again:\n{log}");
        }
        self.wait_for_s3();
    }

    /// Waits until the S3 API answers a request (with anything: an unsigned one is refused).
    fn wait_for_s3(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect_timeout(&self.s3, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "garage's S3 API on {} does not answer:\n{}",
                self.s3,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The `store.object-store` section for `bucket` at `endpoint` with this key, indented for its
/// place under `store:`, with `extra` lines appended.
fn store_yaml(bucket: &str, endpoint: &str, key_id: &str, secret: &str, extra: &str) -> String {
    format!(
        "  object-store:\n    type: s3\n    bucket: {bucket}\n    endpoint: {endpoint}\n    region: {REGION}\n    access-key-id: {key_id}\n    secret-access-key: {secret}\n{extra}"
    )
}

/// Three ports nothing listens on now (TCP on loopback), released for Garage to bind.
fn free_ports() -> [SocketAddr; 3] {
    let bind = || TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binding port 0");
    let listeners = [bind(), bind(), bind()];
    listeners.map(|listener| listener.local_addr().expect("a bound address"))
}

/// A node's config: its directories under `dir`, `replication` copies of every object, its
/// S3 API, RPC and admin API on these addresses; the RPC secret every node of a cluster shares.
fn config_file(
    dir: &Path,
    replication: usize,
    s3: SocketAddr,
    rpc: SocketAddr,
    admin: SocketAddr,
) -> String {
    let secret: String = (0..32)
        .map(|i| format!("{:02x}", (i * 37 + 11) % 256))
        .collect();
    format!(
        r#"metadata_dir = "{meta}"
data_dir = "{data}"
db_engine = "sqlite"
replication_factor = {replication}
rpc_bind_addr = "{rpc}"
rpc_public_addr = "{rpc}"
rpc_secret = "{secret}"

[s3_api]
s3_region = "{REGION}"
api_bind_addr = "{s3}"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "{admin}"
admin_token = "smolder-test-admin-token"
"#,
        meta = dir.join("meta").display(),
        data = dir.join("data").display(),
    )
}

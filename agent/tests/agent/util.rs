//! Fixtures shared by the agent's tests: agents under test collide with no Smolder running on
//! this host on the default ports, the tests that sample the whole host take turns, and the
//! spool's faults have a disk to fill and to slow down.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use smolder_agent::config::Config;
use smolder_test_support::net::{LOOPBACK_ANY_PORT, silent_udp};

/// `config` for an agent under test: its HTTP port on port 0 and its batches shipped to a
/// socket that never answers ([`silent_udp`]).
pub(crate) fn isolated(mut config: Config) -> Config {
    config.http.listen = LOOPBACK_ANY_PORT;
    config.ship.aggregator = silent_udp().to_string();
    config
}

/// Serialises the tests that sample the whole host (`ebpf`, `offcpu`, `unwind`): each would see the
/// others' workloads and compete for the CPUs.
pub(crate) fn exclusive() -> MutexGuard<'static, ()> {
    static HOST: Mutex<()> = Mutex::new(());
    HOST.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A small ext4 filesystem on a loop device, mounted in a temporary directory for one test:
/// a disk the test can fill ([`LoopFs::fill`]) or slow down ([`Throttle`]). Unmounted and
/// detached when dropped. Needs root.
pub(crate) struct LoopFs {
    _dir: tempfile::TempDir,
    device: String,
    mount: PathBuf,
}

impl LoopFs {
    /// A fresh filesystem of `mib` MiB, no blocks reserved for root (so that root fills it
    /// too).
    pub(crate) fn new(mib: u64) -> LoopFs {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
        let device = run("losetup", &["-f", "--show", image.to_str().unwrap()]);
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        run("mkfs.ext4", &["-q", "-m", "0", &device]);
        run("mount", &[&device, mount.to_str().unwrap()]);
        LoopFs {
            _dir: dir,
            device,
            mount,
        }
    }

    /// Where it is mounted.
    pub(crate) fn path(&self) -> &Path {
        &self.mount
    }

    /// The device's `major:minor`, as the cgroup I/O controllers name it.
    pub(crate) fn numbers(&self) -> String {
        let name = self.device.trim_start_matches("/dev/");
        std::fs::read_to_string(format!("/sys/class/block/{name}/dev"))
            .unwrap()
            .trim()
            .to_owned()
    }

    /// Fills what is left of it with one file, which it returns (delete it to free the
    /// space).
    pub(crate) fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.mount.join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let block = vec![0xa5u8; 64 << 10];
        loop {
            match file.write_all(&block) {
                Ok(()) => {}
                Err(err) if err.raw_os_error() == Some(28) => break,
                Err(err) => panic!("filling {}: {err}", path.display()),
            }
        }
        // Whatever did fit is on the disk, so that nothing frees it later.
        let _ = file.sync_all();
        path
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
    }
}

/// Runs `program` with `args`, which must succeed; its stdout, trimmed.
fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("running {program}: {err}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A process's writes to one block device throttled by the block-I/O cgroup controller: cgroup
/// v2's `io.max` where the `io` controller is in the unified hierarchy (systemd hosts), else
/// cgroup v1's `blkio.throttle.write_*_device`. The process goes into a cgroup of its own;
/// [`Throttle::lift`] (or dropping it) takes the limit away.
pub(crate) struct Throttle {
    cgroup: PathBuf,
    /// The limit file and what lifts it.
    limits: Vec<(PathBuf, String)>,
    pid: u32,
    /// The cgroup's parent's `cgroup.procs`, where the process goes back.
    parent: PathBuf,
}

impl Throttle {
    /// Limits process `pid`'s writes to device `numbers` (`major:minor`) to `bytes` per second
    /// and `iops` operations per second.
    pub(crate) fn new(numbers: &str, bytes: u64, iops: u64, pid: u32) -> Throttle {
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let name = format!("smolder-test-{}-{pid}", std::process::id());
        let throttle =
            if std::fs::read_to_string(v2).is_ok_and(|c| c.split_whitespace().any(|c| c == "io")) {
                let root = Path::new("/sys/fs/cgroup");
                // The controller must be enabled for the root's children, and so must the
                // memory controller: without it, writeback (a sync's writes included) is
                // charged to the root cgroup, not to the process that dirtied the pages.
                for controller in ["+io", "+memory"] {
                    let _ = std::fs::write(root.join("cgroup.subtree_control"), controller);
                }
                let cgroup = root.join(name);
                std::fs::create_dir_all(&cgroup).unwrap();
                let max = cgroup.join("io.max");
                std::fs::write(&max, format!("{numbers} wbps={bytes} wiops={iops}")).unwrap();
                Throttle {
                    cgroup,
                    limits: vec![(max, format!("{numbers} wbps=max wiops=max"))],
                    pid,
                    parent: root.join("cgroup.procs"),
                }
            } else {
                let root = Path::new("/sys/fs/cgroup/blkio");
                assert!(
                    root.exists(),
                    "no block-I/O cgroup controller: neither v2's io nor v1's blkio"
                );
                let cgroup = root.join(name);
                std::fs::create_dir_all(&cgroup).unwrap();
                let bps = cgroup.join("blkio.throttle.write_bps_device");
                let ops = cgroup.join("blkio.throttle.write_iops_device");
                std::fs::write(&bps, format!("{numbers} {bytes}")).unwrap();
                std::fs::write(&ops, format!("{numbers} {iops}")).unwrap();
                Throttle {
                    cgroup,
                    limits: vec![(bps, format!("{numbers} 0")), (ops, format!("{numbers} 0"))],
                    pid,
                    parent: root.join("cgroup.procs"),
                }
            };
        std::fs::write(throttle.cgroup.join("cgroup.procs"), pid.to_string()).unwrap();
        throttle
    }

    /// Takes the limit away and the process out of the cgroup.
    pub(crate) fn lift(self) {
        drop(self);
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        for (file, lifted) in &self.limits {
            let _ = std::fs::write(file, lifted);
        }
        // Every thread of the process moves with it; a process that exited is gone already.
        let _ = std::fs::write(&self.parent, self.pid.to_string());
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

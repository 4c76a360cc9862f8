//! What a process is, read from `/proc` while it runs.
//!
//! Input: a process id, read once from `/proc/PID/{comm,exe,cmdline,cgroup,stat,status}` when
//! the sampler first sees the process or after it exec'd ([`ProcessInfo::read`]). Output: a
//! [`ProcessInfo`], with the systemd unit and container id taken from the cgroup path
//! ([`parse_cgroup`]). Caller: the eBPF source, which hands it to the
//! [`Labeller`](super::Labeller). Owns no files or tasks.

use std::path::Path;

/// Longest `__meta_process_cmdline` kept, in bytes; longer command lines are cut at a character
/// boundary (the aggregator's default `ingest.max-label-bytes` is 1024).
const MAX_CMDLINE: usize = 512;

/// What the agent knows about a process, read from `/proc` while it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// The process id.
    pub pid: u32,
    /// `/proc/PID/comm`: the kernel's name for it, at most 15 bytes.
    pub comm: String,
    /// `/proc/PID/exe`: the executable's path as the process sees it; `None` for kernel threads
    /// and when the agent may not read it.
    pub exe: Option<String>,
    /// `/proc/PID/cmdline`, arguments joined by spaces, cut at 512 bytes.
    pub cmdline: String,
    /// The process's cgroup path (cgroup v2's, else the systemd hierarchy's of cgroup v1).
    pub cgroup: String,
    /// The systemd unit (service or scope) the process runs in.
    pub systemd_unit: Option<String>,
    /// The container id (64 hex digits) from the cgroup path.
    pub container_id: Option<String>,
    /// The real user id.
    pub uid: Option<u32>,
    /// The parent's process id.
    pub ppid: Option<u32>,
    /// When the process started, in clock ticks since boot (`/proc/PID/stat` field 22): with the
    /// pid, what tells a process from a later one that reuses its pid.
    pub start_time: u64,
}

/// The process is gone or its `/proc` entry cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("reading /proc/{pid}/{file} failed")]
pub struct ProcessError {
    /// The process.
    pub pid: u32,
    /// The file under `/proc/PID`.
    pub file: &'static str,
    /// Why.
    pub source: std::io::Error,
}

impl ProcessInfo {
    /// Reads a process's metadata from `proc` (normally `/proc`).
    ///
    /// # Errors
    ///
    /// [`ProcessError`] when `comm` cannot be read (the process has exited). Other files that
    /// cannot be read leave their field empty.
    pub fn read(proc: &Path, pid: u32) -> Result<ProcessInfo, ProcessError> {
        let dir = proc.join(pid.to_string());
        let comm = std::fs::read_to_string(dir.join("comm")).map_err(|source| ProcessError {
            pid,
            file: "comm",
            source,
        })?;
        let exe = std::fs::read_link(dir.join("exe"))
            .ok()
            .map(|path| path.to_string_lossy().into_owned());
        let cmdline = std::fs::read(dir.join("cmdline"))
            .map(|bytes| cmdline_text(&bytes))
            .unwrap_or_default();
        let cgroup = std::fs::read_to_string(dir.join("cgroup"))
            .map(|text| parse_cgroup(&text))
            .unwrap_or_default();
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        let start_time = parse_start_time(&stat).unwrap_or(0);
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let status_field = |name: &str| -> Option<u32> {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        Ok(ProcessInfo {
            pid,
            comm: comm.trim_end_matches('\n').to_owned(),
            exe,
            cmdline,
            cgroup: cgroup.path,
            systemd_unit: cgroup.systemd_unit,
            container_id: cgroup.container_id,
            uid: status_field("Uid:"),
            ppid: status_field("PPid:"),
            start_time,
        })
    }

    /// Whether this is a kernel thread: no executable, and `kthreadd` (pid 2) or its child.
    pub fn is_kernel_thread(&self) -> bool {
        self.exe.is_none() && (self.pid == 2 || self.ppid == Some(2))
    }
}

fn cmdline_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut joined = text.trim_end_matches('\0').replace('\0', " ");
    if joined.len() > MAX_CMDLINE {
        let mut cut = MAX_CMDLINE;
        while !joined.is_char_boundary(cut) {
            cut -= 1;
        }
        joined.truncate(cut);
    }
    joined
}

/// What a process's `/proc/PID/cgroup` says about where it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupInfo {
    /// The cgroup v2 path when it is not the root, else the `name=systemd` v1 path, else the
    /// first path listed.
    pub path: String,
    /// The innermost systemd unit (`*.service` or `*.scope`) on any hierarchy's path; a
    /// container's scope does not count.
    pub systemd_unit: Option<String>,
    /// The container id on any hierarchy's path (docker, containerd, CRI-O, podman, kubepods).
    pub container_id: Option<String>,
}

/// Parses `/proc/PID/cgroup` in cgroup v1 (`N:controllers:/path`), v2 (`0::/path`) or hybrid
/// form.
pub fn parse_cgroup(text: &str) -> CgroupInfo {
    let mut v2 = None;
    let mut systemd = None;
    let mut first = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        first.get_or_insert(path);
        if id == "0" && controllers.is_empty() {
            v2 = Some(path);
        } else if controllers == "name=systemd" {
            systemd = Some(path);
        }
    }
    let candidates = [v2, systemd, first];
    let path = candidates
        .iter()
        .flatten()
        .find(|path| **path != "/")
        .or(candidates.iter().flatten().next())
        .map(|path| (*path).to_owned())
        .unwrap_or_default();
    // Units and containers are looked for on the systemd hierarchy first (it is systemd's own
    // view), then v2, then every other line.
    let ordered = [systemd, v2]
        .into_iter()
        .flatten()
        .chain(text.lines().filter_map(|line| line.splitn(3, ':').nth(2)));
    let mut systemd_unit = None;
    let mut container_id = None;
    for cgroup_path in ordered {
        if container_id.is_none() {
            container_id = cgroup_path.split('/').rev().find_map(container_id_of);
        }
        if systemd_unit.is_none() {
            systemd_unit = cgroup_path
                .split('/')
                .rev()
                .find(|part| {
                    (part.ends_with(".service") || part.ends_with(".scope"))
                        && container_id_of(part).is_none()
                })
                .map(str::to_owned);
        }
    }
    CgroupInfo {
        path,
        systemd_unit,
        container_id,
    }
}

/// The container id a cgroup path component names: 64 hex digits, bare (`/docker/<id>`,
/// kubepods) or wrapped as `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
/// `libpod-<id>.scope`.
fn container_id_of(part: &str) -> Option<String> {
    let part = part.strip_suffix(".scope").unwrap_or(part);
    let id = part.rsplit(['-', ':']).next().unwrap_or(part);
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
}

/// The start time of `pid` (clock ticks after boot, `/proc/PID/stat`'s 22nd field); `None` when
/// it is gone.
pub fn process_start_time(pid: u32) -> Option<u64> {
    parse_start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The start time in a `/proc/PID/stat` line: fields after the parenthesised comm (which may
/// hold spaces and parentheses); starttime is the 22nd.
fn parse_start_time(stat: &str) -> Option<u64> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOCKER: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn cgroup_v2_service() {
        let info = parse_cgroup("0::/system.slice/nginx.service\n");
        assert_eq!(info.path, "/system.slice/nginx.service");
        assert_eq!(info.systemd_unit.as_deref(), Some("nginx.service"));
        assert_eq!(info.container_id, None);
    }

    #[test]
    fn cgroup_v1_hybrid_prefers_the_systemd_hierarchy() {
        let text = "12:cpu,cpuacct:/\n1:name=systemd:/system.slice/smolder-test-1.service\n0::/\n";
        let info = parse_cgroup(text);
        assert_eq!(info.systemd_unit.as_deref(), Some("smolder-test-1.service"));
        assert_eq!(info.path, "/system.slice/smolder-test-1.service");
    }

    #[test]
    fn cgroup_containers() {
        for path in [
            format!("0::/system.slice/docker-{DOCKER}.scope"),
            format!("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{DOCKER}.scope"),
            format!("4:memory:/docker/{DOCKER}"),
            format!("0::/kubepods/besteffort/pod9/{DOCKER}"),
        ] {
            let info = parse_cgroup(&path);
            assert_eq!(info.container_id.as_deref(), Some(DOCKER), "{path}");
            assert_eq!(info.systemd_unit, None, "{path}");
        }
    }

    #[test]
    fn reads_this_process() {
        let info = ProcessInfo::read(Path::new("/proc"), std::process::id()).unwrap();
        assert!(info.start_time > 0);
        assert!(info.exe.is_some());
        assert!(!info.comm.is_empty());
        assert!(ProcessInfo::read(Path::new("/proc"), u32::MAX).is_err());
    }

    #[test]
    fn cmdline_is_joined_and_cut() {
        assert_eq!(cmdline_text(b"sleep\x0010\x00"), "sleep 10");
        assert_eq!(cmdline_text(&[b'a'; 600]).len(), MAX_CMDLINE);
    }

    #[test]
    fn the_start_time_is_read_past_a_comm_with_spaces_and_parentheses() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987_654));
        assert_eq!(parse_start_time("42 (x"), None);
        assert!(process_start_time(std::process::id()).is_some_and(|t| t > 0));
    }
}

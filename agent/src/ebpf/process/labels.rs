//! The labels a process's series carry, and the series each kind of sample goes to.
//!
//! Input: a [`ProcessInfo`]. Output: [`ProcessLabels`] (a service name and labels), or nothing
//! when the `ebpf.relabel-configs` rules drop the process ([`Labeller::labels`]); each
//! [`SampleKind`] makes its own series of them (`<service_name>.cpu{...}`). Caller: the eBPF
//! source, once per process and exec. Owns no files or tasks.
//!
//! Before relabelling, a process has the `__meta_process_*` labels (`pid`, `comm`, `exe`,
//! `cmdline`, `cgroup`, `systemd_unit`, `container_id`, `user`) and the preset labels
//! `service_name`, `hostname`, and, where known, `systemd_unit` and `container_id`. The default
//! `service_name` is the process's systemd service (`nginx` for `nginx.service`), else its
//! container id (the 12-character short form, as `docker ps` shows it), else the executable's
//! file name, else `kernel` for kernel threads. Labels starting with `__` are removed after
//! relabelling.

use std::collections::HashMap;

use smolder_common::series;
use smolder_common::{Labels, Series};

use super::ProcessInfo;
use crate::ebpf::SampleKind;
use crate::relabel::{LabelSet, Relabeler};

/// What every series of one process is called, whatever its samples measure: its service name
/// and labels (`service_name` among them). A [`SampleKind`] adds the profile type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProcessLabels {
    pub(super) service: String,
    pub(super) labels: Labels,
}

impl ProcessLabels {
    /// The series of this process's samples of `kind`: `<service_name>.<profile type>{labels}`.
    pub fn series(&self, kind: SampleKind) -> Series {
        Series::new(
            format!("{}.{}", self.service, kind.profile_type()),
            self.labels.clone(),
        )
        .expect("a sanitized app name and a profile type make a valid app name")
    }
}

impl ProcessInfo {
    /// The default `service_name`: systemd service, else short container id, else executable
    /// file name, else `kernel` for kernel threads, else `comm`. Characters a series name cannot
    /// hold become `_`.
    pub fn service_name(&self) -> String {
        let service = self
            .systemd_unit
            .as_deref()
            .and_then(|unit| unit.strip_suffix(".service"))
            // A template instance (`getty@tty1.service`) is one service with many instances.
            .map(|unit| unit.split('@').next().unwrap_or(unit));
        let name = match (service, &self.container_id, &self.exe) {
            (Some(service), _, _) => service.to_owned(),
            (None, Some(id), _) => id.chars().take(12).collect(),
            (None, None, Some(exe)) => {
                let exe = exe.strip_suffix(" (deleted)").unwrap_or(exe);
                exe.rsplit('/').next().unwrap_or(exe).to_owned()
            }
            (None, None, None) if self.is_kernel_thread() => "kernel".to_owned(),
            (None, None, None) => self.comm.clone(),
        };
        sanitize_app_name(&name)
    }
}

/// `name` as an app name (the series rule, in `smolder_common::series`); an empty name becomes
/// `unknown`.
fn sanitize_app_name(name: &str) -> String {
    if name.is_empty() {
        return "unknown".to_owned();
    }
    series::sanitize_app_name(name)
}
/// Turns process metadata into a process's labels, applying the configured relabel rules.
#[derive(Clone, Debug)]
pub struct Labeller {
    relabeler: Relabeler,
    hostname: String,
    users: HashMap<u32, String>,
}

impl Labeller {
    /// A labeller for `hostname`, with user names from `/etc/passwd`.
    pub fn new(relabeler: Relabeler, hostname: String) -> Labeller {
        let users = std::fs::read_to_string("/etc/passwd")
            .map(|text| parse_passwd(&text))
            .unwrap_or_default();
        Labeller {
            relabeler,
            hostname,
            users,
        }
    }

    /// The labels of `info` before relabelling: `__meta_process_*` and the presets.
    pub fn meta_labels(&self, info: &ProcessInfo) -> LabelSet {
        let mut labels = LabelSet::new();
        let mut set = |name: &str, value: &str| {
            if !value.is_empty() {
                labels.insert(name.to_owned(), value.to_owned());
            }
        };
        set("__meta_process_pid", &info.pid.to_string());
        set("__meta_process_comm", &info.comm);
        set("__meta_process_exe", info.exe.as_deref().unwrap_or(""));
        set("__meta_process_cmdline", &info.cmdline);
        set("__meta_process_cgroup", &info.cgroup);
        let unit = info.systemd_unit.as_deref().unwrap_or("");
        let container = info.container_id.as_deref().unwrap_or("");
        set("__meta_process_systemd_unit", unit);
        set("__meta_process_container_id", container);
        let user = info.uid.map(|uid| {
            self.users
                .get(&uid)
                .cloned()
                .unwrap_or_else(|| uid.to_string())
        });
        set("__meta_process_user", user.as_deref().unwrap_or(""));
        set("service_name", &info.service_name());
        set("hostname", &self.hostname);
        set("systemd_unit", unit);
        set("container_id", container);
        labels
    }

    /// The labels of `info`'s series, or `None` when a relabel rule drops the process.
    /// Labels that are not valid series label names after relabelling are left out.
    pub fn labels(&self, info: &ProcessInfo) -> Option<ProcessLabels> {
        let mut labels = self.meta_labels(info);
        if !self.relabeler.apply(&mut labels) {
            return None;
        }
        let service = labels
            .get("service_name")
            .map(|name| sanitize_app_name(name))
            .unwrap_or_else(|| info.service_name());
        let mut kept = Labels::new();
        for (name, value) in labels.iter().filter(|(name, _)| !name.starts_with("__")) {
            if kept.insert(name.as_str(), value.as_str()).is_err() {
                tracing::debug!(label = %name, "relabelling made an invalid label name; left out");
            }
        }
        let _ = kept.insert("service_name", service.as_str());
        Some(ProcessLabels {
            service,
            labels: kept,
        })
    }
}

/// User names by uid from `/etc/passwd`'s `name:x:uid:...` lines.
fn parse_passwd(text: &str) -> HashMap<u32, String> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let uid = fields.nth(1)?.parse().ok()?;
            Some((uid, name.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relabel::RelabelConfig;

    const DOCKER: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn service_name_order() {
        let mut info = ProcessInfo {
            pid: 10,
            comm: "worker".into(),
            exe: Some("/usr/local/bin/my app (deleted)".into()),
            ..ProcessInfo::default()
        };
        assert_eq!(info.service_name(), "my_app");
        info.container_id = Some(DOCKER.into());
        assert_eq!(info.service_name(), "0123456789ab");
        info.systemd_unit = Some("getty@tty1.service".into());
        assert_eq!(info.service_name(), "getty");
        let kthread = ProcessInfo {
            pid: 77,
            ppid: Some(2),
            comm: "kworker/0:1".into(),
            ..ProcessInfo::default()
        };
        assert_eq!(kthread.service_name(), "kernel");
    }

    #[test]
    fn series_after_relabelling() {
        let rules: Vec<RelabelConfig> = serde_norway::from_str(
            r#"
- source_labels: [__meta_process_comm]
  regex: "sshd"
  action: drop
- source_labels: [__meta_process_user]
  target_label: user
"#,
        )
        .unwrap();
        let labeller = Labeller {
            relabeler: Relabeler::new(&rules).unwrap(),
            hostname: "host-1".into(),
            users: HashMap::from([(1000, "ada".to_owned())]),
        };
        let info = ProcessInfo {
            pid: 5,
            comm: "server".into(),
            exe: Some("/srv/server".into()),
            uid: Some(1000),
            systemd_unit: Some("api.service".into()),
            ..ProcessInfo::default()
        };
        let series = labeller.labels(&info).unwrap().series(SampleKind::Cpu);
        assert_eq!(
            series.to_string(),
            "api.cpu{hostname=host-1,service_name=api,systemd_unit=api.service,user=ada}"
        );
        let sshd = ProcessInfo {
            comm: "sshd".into(),
            ..info
        };
        assert!(labeller.labels(&sshd).is_none());
    }
}

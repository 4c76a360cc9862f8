//! Prometheus' naming rules, in one place: what a metric name and a label name may be.
//!
//! Callers: rules (metric names and `group_by` labels), the agent's relabelling (target labels)
//! and the aggregator's remote write (extra labels). Series label names follow a different,
//! Pyroscope-derived rule (dots allowed): see [`series`](crate::series).

/// Whether `name` is a Prometheus metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `name` is a Prometheus label name: `[a-zA-Z_][a-zA-Z0-9_]*`, reserved names
/// (starting with `__`) included, as relabelling reads and writes them.
pub fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `name` is a label name a user may put on a series: a Prometheus label name that
/// does not start with `__`, which Prometheus reserves for itself.
pub fn is_user_label_name(name: &str) -> bool {
    is_label_name(name) && !name.starts_with("__")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus() {
        for good in ["a", "_a", "a:b", "job:rate5m", "A_1"] {
            assert!(is_metric_name(good), "{good}");
        }
        for bad in ["", "1a", "a-b", "a.b", "a b", "é"] {
            assert!(!is_metric_name(bad), "{bad}");
        }
        for good in ["a", "_a", "__address__", "env_2"] {
            assert!(is_label_name(good), "{good}");
        }
        for bad in ["", "a:b", "1a", "service.name", "a-b"] {
            assert!(!is_label_name(bad), "{bad}");
        }
        assert!(is_user_label_name("env"));
        assert!(!is_user_label_name("__address__"));
        assert!(!is_user_label_name("a-b"));
    }
}

//! The file downloads of `/render`: `format=collapsed` (folded text) and `format=pprof`.

use std::time::SystemTime;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use smolder_common::pprof::{self, EncodeOptions};
use smolder_common::{ProfileMeta, Tree};

use super::unix_secs;

/// What Pyroscope names a rendered profile, and its downloads before the extension:
/// `"<app> <RFC 3339 start, UTC>"`.
pub(super) fn profile_name(app: &str, from: SystemTime) -> String {
    format!("{app} {}", rfc3339_utc(unix_secs(from)))
}

/// `format=collapsed`: the tree as folded text, root first, one line per stack with its self
/// value, downloaded as `<name>.collapsed.txt`.
pub(super) fn collapsed(tree: &Tree, name: &str) -> Response {
    let text = smolder_common::to_folded(tree);
    attachment(
        "text/plain; charset=utf-8",
        &format!("{name}.collapsed.txt"),
        text.into_bytes(),
    )
}

/// `format=pprof`: the tree as a gzipped pprof profile, downloaded as `<name>.pprof`.
///
/// The sample type is the one the profile would have been pushed as, so that a download pushed
/// back through `/ingest?format=pprof` lands in a series of the same name: CPU (`samples` with
/// a sample rate) is `samples`/`count` with a `cpu`/`nanoseconds` period of 10^9 / rate, as Go
/// writes it; other types are named after the app's last dot-segment (`alloc_space`,
/// `goroutines` → `goroutine`, `mutex_count` → `contentions`...) with `bytes`, `nanoseconds` or
/// `count` as the unit.
pub(super) fn pprof(
    tree: &Tree,
    app: &str,
    meta: Option<&ProfileMeta>,
    (from, until): (SystemTime, SystemTime),
    name: &str,
) -> Response {
    let mut options = encode_options(app, meta);
    options.time_nanos = nanos_since_epoch(from);
    options.duration_nanos = until
        .duration_since(from)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    let bytes = pprof::encode(tree, &options).to_bytes(true);
    attachment("application/octet-stream", &format!("{name}.pprof"), bytes)
}

/// The pprof sample type, unit and period for a series of `app` with `meta`.
fn encode_options(app: &str, meta: Option<&ProfileMeta>) -> EncodeOptions {
    let units = meta.map_or("samples", |m| m.units.as_str());
    let rate = meta.map_or(0, |m| m.sample_rate);
    let suffix = app.rsplit('.').next().unwrap_or(app);
    if units == "samples" && (rate > 0 || suffix == "cpu") {
        return EncodeOptions::cpu_samples(if rate > 0 { rate } else { 100 });
    }
    // The inverse of Pyroscope's default sample-type table (`smolder_common::pprof::SampleTypes`).
    let sample_type = match suffix {
        "goroutines" => "goroutine",
        "mutex_count" | "block_count" => "contentions",
        "mutex_duration" | "block_duration" => "delay",
        "inuse_objects" | "inuse_space" | "alloc_objects" | "alloc_space" => suffix,
        _ => units,
    };
    let unit = match units {
        "bytes" => "bytes",
        "lock_nanoseconds" | "nanoseconds" => "nanoseconds",
        _ => "count",
    };
    EncodeOptions::new(sample_type, unit)
}

fn nanos_since_epoch(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A download: `Content-Disposition: attachment` with `filename` quoted (and `"` and `\`
/// dropped from it, since app names cannot contain them anyway).
fn attachment(content_type: &'static str, filename: &str, body: Vec<u8>) -> Response {
    let safe: String = filename
        .chars()
        .filter(|c| *c != '"' && *c != '\\' && !c.is_control())
        .collect();
    (
        [
            (header::CONTENT_TYPE, content_type.to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{safe}\""),
            ),
        ],
        body,
    )
        .into_response()
}

/// `YYYY-MM-DDTHH:MM:SSZ` for unix seconds `secs`, as Go's `time.RFC3339` writes a UTC time.
pub(super) fn rfc3339_utc(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let of_day = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// The proleptic Gregorian date of day `days` since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_go() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(1_662_466_591), "2022-09-06T12:16:31Z");
        assert_eq!(rfc3339_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(-1), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn sample_types_invert_pyroscopes_table() {
        let meta = |units: &str, rate| ProfileMeta {
            units: units.to_owned(),
            sample_rate: rate,
            ..ProfileMeta::default()
        };
        let cpu = encode_options("app.cpu", Some(&meta("samples", 99)));
        assert_eq!(
            (cpu.sample_type.as_str(), cpu.unit.as_str()),
            ("samples", "count")
        );
        assert_eq!(cpu.period.map(|p| p.value), Some(1_000_000_000 / 99));
        let heap = encode_options("app.inuse_space", Some(&meta("bytes", 0)));
        assert_eq!(
            (heap.sample_type.as_str(), heap.unit.as_str()),
            ("inuse_space", "bytes")
        );
        assert!(heap.period.is_none());
        let mutex = encode_options("app.mutex_duration", Some(&meta("lock_nanoseconds", 0)));
        assert_eq!(
            (mutex.sample_type.as_str(), mutex.unit.as_str()),
            ("delay", "nanoseconds")
        );
    }
}

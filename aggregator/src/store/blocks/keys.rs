//! Names as key segments under `shared/`: one escaping for every key there (tenant ids, recording
//! rules' names in `rules.rs`, app names in `deletions.rs`), so that any name is a key that every
//! S3 store and object_store keep as written, and that reads back as the name.
//!
//! ASCII letters, digits, `_`, `-` and `.` are kept, so that the usual names read as they are
//! (`shared/deletions/anonymous/checkout.cpu/1700000010`); every other byte is written `=XX`
//! (upper-case hex), and so is every byte of a name made only of dots (object_store rewrites
//! the segments `.` and `..`). Nothing object_store would percent-encode (`*`, `%`, `~`, ...)
//! is kept: a listing would give it back encoded, another name.

/// `name` as a key segment; see the [module documentation](self).
pub(crate) fn escape(name: &str) -> String {
    let dots = name.bytes().all(|b| b == b'.');
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        let kept = byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b'.');
        if kept && !(dots && byte == b'.') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("={byte:02X}"));
        }
    }
    out
}

/// The name [`escape`] wrote as `segment`; `None` for an empty segment or one that `escape`
/// does not write (a bad escape, lower-case hex, a byte escaped that is kept), so that each name
/// has one key.
pub(crate) fn unescape(segment: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(segment.len());
    let mut rest = segment.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'=' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    let name = String::from_utf8(bytes).ok()?;
    (!name.is_empty() && escape(&name) == segment).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_segments_that_object_store_keeps() {
        for name in [
            "checkout.cpu",
            "a_b-c.d",
            "app:cpu_seconds_total",
            "team.a*(1)",
            ".",
            "..",
            "...",
            ".a",
            "a=b",
            "a+b",
            "a/b",
            "a b",
            "ü",
            "%2E",
            "=2E",
        ] {
            let segment = escape(name);
            assert!(
                segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.=".contains(&b)),
                "{name:?}: {segment}"
            );
            assert!(!segment.bytes().all(|b| b == b'.'), "{name:?}: {segment}");
            assert_eq!(
                object_store::path::Path::from(segment.as_str()).as_ref(),
                segment,
                "object_store keeps {segment}"
            );
            assert_eq!(unescape(&segment).as_deref(), Some(name), "{segment}");
        }
        // What a key left unescaped would come back as from a listing: another name.
        assert_eq!(
            object_store::path::Path::from("team.a*(1)").as_ref(),
            "team.a%2A(1)"
        );
        assert_eq!(escape("checkout.cpu"), "checkout.cpu");
        assert_eq!(escape(".."), "=2E=2E");
        assert_eq!(escape("team.a*(1)"), "team.a=2A=281=29");
        for bad in [
            "", "=", "=4", "=ZZ", "=FF", "=2e", "=61pp", "a/b", "a=2Eb=2F",
        ] {
            assert_eq!(unescape(bad), None, "{bad}");
        }
    }
}

//! One object that every aggregator of a bucket adopts, written by whichever starts first, on
//! stores that do not honour conditional writes (object-storage mode): the development identity
//! (`shared/identity/`).
//!
//! Garage overwrites a `PutMode::Create`, so no aggregator can write an object only if none is
//! there. Instead, an aggregator that lists the prefix and finds nothing writes its own
//! *candidate* under it (a random key), waits the settle time, lists again and adopts the
//! candidate with the smallest key. One that finds candidates adopts the smallest without
//! writing, after waiting until the newest is the settle time old (by the store's clock), so
//! that it sees every candidate its writers will compare. A writer's candidate is stored within
//! half the settle time of its empty listing (a write of a few KiB takes milliseconds; a slower
//! one fails the start, saying so), so it is in the second listing of every writer whose own
//! listing was empty too: they all adopt the same. The candidates that lost are deleted by their writers, which
//! never changes the choice (the smallest stays).
//!
//! Called once, at start, on the blocking pool ([`super::BlockStore::adopt_identity`]).

use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{info, warn};

use super::bucket::Bucket;
use super::files::bucket_error;
use super::uploads::BucketMode;
use crate::store::StoreError;

/// Where the development identity's candidates are, under the bucket's prefix.
const IDENTITY: &str = "shared/identity/";

/// How long a writer waits for others' candidates: far longer than a write of a few KiB takes
/// (milliseconds on Garage here), so that two aggregators started together both see both.
const SETTLE: Duration = Duration::from_secs(3);

/// What a store's Last-Modified may be off from the heartbeat's view of its clock (some
/// stores give whole seconds).
const CLOCK_MARGIN: Duration = Duration::from_secs(1);

/// What the bucket settled on.
pub(crate) struct Adopted {
    /// Its key.
    pub(crate) key: String,
    /// Its bytes.
    pub(crate) bytes: Bytes,
}

/// The development identity every aggregator of `mode`'s bucket adopts ([`IDENTITY`]),
/// offering `candidate` when there is none yet.
///
/// # Errors
///
/// As [`adopt`].
pub(crate) fn adopt_identity(mode: &BucketMode, candidate: Vec<u8>) -> Result<Vec<u8>, StoreError> {
    let adopted = adopt(
        &mode.bucket,
        IDENTITY,
        Bytes::from(candidate),
        SETTLE,
        || mode.sync.lock().expect("sync lock").store_now(),
    )?;
    info!(object = %adopted.key, "the development identity is the bucket's");
    Ok(adopted.bytes.to_vec())
}

/// Adopts the object of `prefix` that the bucket's aggregators settle on, offering `candidate`
/// when there is none yet; see the [module documentation](self). `store_now` is now by the
/// store's clock (Unix ms). Blocks for up to `settle` and a little more.
///
/// # Errors
///
/// When the bucket cannot be listed, written or read.
pub(crate) fn adopt(
    bucket: &Bucket,
    prefix: &str,
    candidate: Bytes,
    settle: Duration,
    store_now: impl Fn() -> u64,
) -> Result<Adopted, StoreError> {
    let started = Instant::now();
    let listed = bucket.list(prefix).map_err(bucket_error)?;
    let own = match listed
        .iter()
        .map(|o| o.last_modified.timestamp_millis())
        .max()
    {
        None => {
            let key = format!("{prefix}{:016x}", rand::random::<u64>());
            // Stored within half the settle time of the empty listing, or not counted on: a
            // slower write could land after another writer's second listing, which would then
            // have adopted a different candidate. The start fails instead (and the next one
            // adopts what the bucket holds by then).
            let deadline = (settle / 2).saturating_sub(started.elapsed());
            bucket
                .put_within(&key, candidate, deadline)
                .map_err(bucket_error)?;
            info!(object = %key, ?settle, "nothing shared in the bucket yet: offered a candidate; waiting for others' before adopting the first");
            std::thread::sleep(settle);
            Some(key)
        }
        Some(newest) => {
            let age = Duration::from_millis(
                store_now().saturating_sub(u64::try_from(newest).unwrap_or(0)),
            );
            let wait = (settle + CLOCK_MARGIN).saturating_sub(age);
            if !wait.is_zero() {
                info!(
                    ?wait,
                    "a candidate in the bucket is recent: waiting for any others before adopting the first"
                );
                std::thread::sleep(wait);
            }
            None
        }
    };
    let listed = bucket.list(prefix).map_err(bucket_error)?;
    let first = listed
        .first()
        .and_then(|object| bucket.key(&object.location))
        .ok_or_else(|| StoreError::Object {
            what: format!("listing {prefix}: no candidate, though one was written"),
            source: "the candidate is gone".into(),
        })?
        .to_owned();
    let bytes = bucket.get(&first).map_err(bucket_error)?;
    if let Some(own) = own.filter(|own| *own != first) {
        info!(adopted = %first, own = %own, "another aggregator's candidate came first; deleting ours");
        if let Err(err) = bucket.delete(&own) {
            warn!(object = %own, error = %err, "deleting a candidate that lost failed; it is never adopted, delete it by hand");
        }
    }
    Ok(Adopted { key: first, bytes })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn candidates_offered_at_once_settle_on_one_that_later_starts_adopt() {
        let bucket = Arc::new(Bucket::in_memory());
        let settle = Duration::from_millis(300);
        let now = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
        };
        let offers: Vec<_> = (0..4u8)
            .map(|i| {
                let bucket = Arc::clone(&bucket);
                std::thread::spawn(move || {
                    adopt(&bucket, IDENTITY, Bytes::from(vec![i]), settle, now).unwrap()
                })
            })
            .collect();
        let adopted: Vec<Adopted> = offers.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(
            adopted
                .iter()
                .all(|a| a.key == adopted[0].key && a.bytes == adopted[0].bytes)
        );
        assert_eq!(
            bucket.list(IDENTITY).unwrap().len(),
            1,
            "the others' deleted"
        );
        let later = adopt(&bucket, IDENTITY, Bytes::from_static(b"late"), settle, now).unwrap();
        assert_eq!(later.bytes, adopted[0].bytes);
        assert_eq!(bucket.list(IDENTITY).unwrap().len(), 1, "nothing written");
    }

    #[test]
    fn a_candidate_written_during_the_settle_time_wins_when_its_key_is_smaller() {
        let settle = Duration::from_millis(500);
        let now = || 0;
        for (other, wins) in [("0000000000000000", true), ("ffffffffffffffff", false)] {
            let bucket = Arc::new(Bucket::in_memory());
            let offer = {
                let bucket = Arc::clone(&bucket);
                std::thread::spawn(move || {
                    adopt(&bucket, IDENTITY, Bytes::from_static(b"own"), settle, now).unwrap()
                })
            };
            // Another aggregator's, written while the first waits.
            std::thread::sleep(settle / 5);
            let key = format!("{IDENTITY}{other}");
            bucket.put(&key, Bytes::from_static(b"other")).unwrap();
            let adopted = offer.join().unwrap();
            let left: Vec<String> = bucket
                .list(IDENTITY)
                .unwrap()
                .iter()
                .map(|o| o.location.to_string())
                .collect();
            if wins {
                assert_eq!(
                    (adopted.key.as_str(), &adopted.bytes[..]),
                    (key.as_str(), &b"other"[..])
                );
                assert_eq!(left, [key], "the losing candidate deleted by its writer");
            } else {
                assert_eq!(&adopted.bytes[..], b"own");
                assert_eq!(left.len(), 2, "the other's writer deletes its own");
            }
        }
    }
}

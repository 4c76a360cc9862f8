//! The S3 backend: a bucket of any S3-compatible store (AWS S3, GCS's S3 API, MinIO, Ceph RGW,
//! Garage) through `object_store`, configured by `store.object-store` with `type: s3`.
//!
//! Input: [`S3Config`]; output: a [`Bucket`] whose calls block the calling thread (the store's
//! writer, cuts, compaction and reads all run off tokio's workers) while the request runs on the
//! bucket's own small runtime, so that no call ever waits on a runtime it is running on. Callers:
//! `files.rs` (blocks), and the segment and sync code of object-storage mode.
//!
//! Every key lives under `prefix/`: `blocks/`, `segments/`, `aggregators/` (ARCHITECTURE.md,
//! "Object storage and several aggregators"). [`Bucket::connect`] checks at start that the bucket
//! answers, that the credentials may list, write, read and delete there, and whether it honours
//! conditional writes, so that a wrong endpoint, bucket or key fails the start with a message
//! that says which.
//!
//! HTTP goes through reqwest 0.12 on rustls with ring ([`Connector`]): object_store's own
//! reqwest 0.13 client needs aws-lc-rs (see the workspace Cargo.toml).

use std::io::BufRead;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService,
};
use object_store::path::Path as ObjectPath;
use object_store::{
    ClientOptions, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig, UpdateVersion, WriteMultipart,
};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::store::metrics::ObjectMetrics;

/// An S3 bucket shared by every aggregator that names it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct S3Config {
    /// The bucket's name. Required.
    pub bucket: String,
    /// The store's URL, such as `http://127.0.0.1:3900` for a Garage node or
    /// `https://storage.googleapis.com` for GCS. Default empty: AWS S3 in `region` (or the
    /// environment's `AWS_ENDPOINT`).
    pub endpoint: String,
    /// The bucket's region (Garage's default is `garage`). Default `us-east-1`.
    pub region: String,
    /// Addresses the bucket in the path (`endpoint/bucket/key`) rather than in the host name
    /// (`bucket.endpoint/key`, virtual-hosted style). Most self-hosted stores (Garage, MinIO)
    /// want path style. Default `true`.
    pub path_style: bool,
    /// A key prefix every object of this store goes under, so that several stores share one
    /// bucket. Default empty.
    pub prefix: String,
    /// The access key id. Default empty: from `credentials-file`, else the environment
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, web identity,
    /// instance metadata).
    pub access_key_id: String,
    /// The secret access key, with `access-key-id`. Default empty.
    pub secret_access_key: String,
    /// A file of AWS shared-credentials format (`[profile]` sections of
    /// `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`), read when
    /// `access-key-id` is empty. Default empty: none.
    pub credentials_file: PathBuf,
    /// The profile of `credentials-file` to read. Default `default`.
    pub credentials_profile: String,
    /// A PEM file of CA certificates trusted for the endpoint's TLS, beside the system's
    /// roots. Default empty: the system's roots only.
    pub ca_file: PathBuf,
    /// How long one request may go without progress (connect, send, or between bytes read)
    /// before it fails; object_store retries a failed request for up to three times this.
    /// Default `10s`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub request_timeout: Duration,
    /// The least time between two segment uploads: writes arriving meanwhile wait and share the
    /// next one, so that an aggregator makes at most 1/interval PUTs a second; a write arriving
    /// at an idle aggregator goes at once. From `10ms` to `1s`. Default `500ms` (Pyroscope v2's
    /// segment duration).
    #[serde(with = "serde_interval")]
    pub upload_interval: Duration,
    /// How long a segment's upload may take, retries included, before its writes are refused
    /// as retryable (`unavailable`); after a failed upload, writes are refused at once for this
    /// long before the next upload is tried. An app deletion's object has as long (else 503). Below agents' `ship.ack-timeout` (10 s), so that
    /// they hear the refusal and move to their next aggregator at once instead of waiting for
    /// an ack that a bucket out of reach will not let come. From `1s` to `60s`. Default `5s`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub upload_timeout: Duration,
    /// How often the bucket is polled for other aggregators' segments and blocks (and this
    /// one's heartbeat rewritten, at most every 10 s). Default `2s`.
    #[serde(with = "serde_interval")]
    pub poll_interval: Duration,
    /// An aggregator whose heartbeat is older than this is taken for gone: its segments are
    /// adopted, cut into blocks and deleted by the live aggregator with the smallest id. The
    /// heartbeat is rewritten every third of this (at most every 10 s). At least three times
    /// `poll-interval`. Default `60s`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub orphan_after: Duration,
    /// Whether this aggregator merges, downsamples and applies retention to the bucket's
    /// blocks. `true`: it may, and of those that may one at a time does: the holder of a lease
    /// where the store honours conditional writes (AWS S3, MinIO, Ceph RGW), else the live one
    /// with the smallest writer id (Garage); the log says which. `always`: it does, whatever the
    /// others do (a configured role: give it to one aggregator and `false` to the rest).
    /// `false`: never. Two that compact at once lose and double-count nothing. Default `true`.
    pub compactor: Compactor,
    /// How long a block that merges replace stays in the bucket, hidden, before a compactor
    /// deletes it: longer than any aggregator's view of the bucket may be old, and than a merge
    /// may take to finish its upload. At least ten times `poll-interval` and twice
    /// `request-timeout`. Default `10m`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub compaction_grace: Duration,
    /// Bytes of local disk for copies of the bucket's blocks (`<data-dir>/cache/blocks/`):
    /// blocks read or written here are kept whole, and the least recently read go first when a
    /// new one needs the room. A block opened without its copy costs a ranged read of its end
    /// (its index and names, kept in memory); the first read of its profiles downloads it whole
    /// (one GET). A block larger than a quarter of this, or than the room that reads leave, is
    /// read with ranged GETs instead. 0 keeps no copies. Default 10 GiB (OPERATIONS.md,
    /// "Sizing").
    pub block_cache_bytes: u64,
}

impl Default for S3Config {
    fn default() -> Self {
        S3Config {
            bucket: String::new(),
            endpoint: String::new(),
            region: "us-east-1".into(),
            path_style: true,
            prefix: String::new(),
            access_key_id: String::new(),
            secret_access_key: String::new(),
            credentials_file: PathBuf::new(),
            credentials_profile: "default".into(),
            ca_file: PathBuf::new(),
            request_timeout: Duration::from_secs(10),
            upload_interval: Duration::from_millis(500),
            upload_timeout: Duration::from_secs(5),
            poll_interval: Duration::from_secs(2),
            orphan_after: Duration::from_secs(60),
            compactor: Compactor::TakesTurns,
            compaction_grace: Duration::from_secs(600),
            block_cache_bytes: 10 << 30,
        }
    }
}

/// Whether an aggregator compacts the bucket (`store.object-store.compactor`): written `false`,
/// `true` or `always`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compactor {
    /// `false`: never.
    Never,
    /// `true`: takes turns with the others that may, through a lease or the election.
    #[default]
    TakesTurns,
    /// `always`: compacts whatever the others do.
    Always,
}

impl Compactor {
    /// Whether it may compact at all.
    pub(crate) fn may(self) -> bool {
        self != Compactor::Never
    }
}

impl Serialize for Compactor {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Compactor::Never => serializer.serialize_bool(false),
            Compactor::TakesTurns => serializer.serialize_bool(true),
            Compactor::Always => serializer.serialize_str("always"),
        }
    }
}

impl<'de> Deserialize<'de> for Compactor {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Flag(bool),
            Word(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Flag(false) => Ok(Compactor::Never),
            Written::Flag(true) => Ok(Compactor::TakesTurns),
            Written::Word(word) if word == "always" => Ok(Compactor::Always),
            Written::Word(word) => Err(D::Error::custom(format!(
                "compactor is true, false or always, not {word:?}"
            ))),
        }
    }
}

/// An interval that may be shorter than a second: `500ms`, or a duration as every other key
/// writes one (`2s`, `1m`).
mod serde_interval {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(super) fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        if value.subsec_nanos() == 0 {
            smolder_common::timestamp::serde_duration::serialize(value, s)
        } else {
            s.serialize_str(&format!("{}ms", value.as_millis()))
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        match text.trim().strip_suffix("ms") {
            Some(millis) => millis
                .trim()
                .parse()
                .map(Duration::from_millis)
                .map_err(|_| D::Error::custom(format!("{text:?}: not a whole number of ms"))),
            None => smolder_common::timestamp::parse_offset(&text).map_err(D::Error::custom),
        }
    }
}

/// Why the bucket could not be used at start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BucketError {
    /// A key of `store.object-store` is missing or wrong.
    #[error("store.object-store.{key}: {reason}")]
    Config { key: &'static str, reason: String },
    /// A file the config names could not be read.
    #[error("store.object-store.{key}: cannot read {path}")]
    File {
        key: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The bucket's runtime could not start.
    #[error("starting the object store's runtime")]
    Runtime(#[source] std::io::Error),
    /// The store refused or failed the start's check.
    #[error("{what}")]
    Check {
        what: String,
        #[source]
        source: object_store::Error,
    },
}

/// An S3 bucket (under a prefix), and the runtime its requests run on.
pub(crate) struct Bucket {
    store: Arc<dyn ObjectStore>,
    /// Dropped in the background ([`Drop`]): the store may be dropped inside another runtime.
    runtime: Option<tokio::runtime::Runtime>,
    prefix: String,
    /// Whether the store refused a second `PutMode::Create` of one key (AWS S3, MinIO, Ceph
    /// RGW); Garage overwrites.
    conditional: bool,
    /// What the log calls it: `s3://bucket/prefix at endpoint`.
    name: String,
}

/// An object read with its version ([`Bucket::get_versioned`]).
pub(crate) struct Versioned {
    pub(crate) bytes: Bytes,
    /// Its ETag, which a conditional update names.
    pub(crate) e_tag: Option<String>,
    /// Its Last-Modified, Unix milliseconds by the store's clock.
    pub(crate) modified: u64,
}

/// A failure of the store, named with what was being done to which key.
#[derive(Debug, thiserror::Error)]
#[error("{what} {key}")]
pub(crate) struct RequestError {
    what: &'static str,
    key: String,
    #[source]
    pub(crate) source: object_store::Error,
}

impl RequestError {
    /// Whether the object does not exist.
    pub(crate) fn not_found(&self) -> bool {
        matches!(self.source, object_store::Error::NotFound { .. })
    }
}

impl Bucket {
    /// Connects to the bucket `config` names and checks it: it can be listed, and an object
    /// written, read back and deleted (`aggregators/.probe-<random>`); then whether it honours
    /// conditional writes, logged either way.
    ///
    /// Every request is counted in `metrics`.
    ///
    /// # Errors
    ///
    /// A [`BucketError`] naming the config key or the check that failed: the bucket missing,
    /// credentials refused, the endpoint unreachable.
    pub(crate) fn connect(
        config: &S3Config,
        metrics: ObjectMetrics,
    ) -> Result<Bucket, BucketError> {
        if config.bucket.is_empty() {
            return Err(BucketError::Config {
                key: "bucket",
                reason: "empty; name the bucket to keep blocks in".into(),
            });
        }
        if !(Duration::from_millis(10)..=Duration::from_secs(1)).contains(&config.upload_interval) {
            return Err(BucketError::Config {
                key: "upload-interval",
                reason: "must be from 10ms to 1s: an acknowledgement waits up to this long".into(),
            });
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(60)).contains(&config.upload_timeout) {
            return Err(BucketError::Config {
                key: "upload-timeout",
                reason: "must be from 1s to 60s: writes wait up to this long for their upload"
                    .into(),
            });
        }
        if config.poll_interval.is_zero() {
            return Err(BucketError::Config {
                key: "poll-interval",
                reason: "must be more than 0s".into(),
            });
        }
        if config.orphan_after < config.poll_interval * 3 {
            return Err(BucketError::Config {
                key: "orphan-after",
                reason: "must be at least three times poll-interval, or a live aggregator whose heartbeat is a poll late would be taken for gone".into(),
            });
        }
        if config.compaction_grace < (config.poll_interval * 10).max(config.request_timeout * 2) {
            return Err(BucketError::Config {
                key: "compaction-grace",
                reason: "must be at least ten times poll-interval and twice request-timeout: a block is deleted only once every aggregator's view shows what replaces it".into(),
            });
        }
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_virtual_hosted_style_request(!config.path_style)
            .with_allow_http(true)
            .with_http_connector(Connector::new(config, metrics)?)
            .with_retry(RetryConfig {
                max_retries: 3,
                retry_timeout: config.request_timeout * 3,
                ..RetryConfig::default()
            });
        if !config.endpoint.is_empty() {
            builder = builder.with_endpoint(&config.endpoint);
        }
        if let Some(credentials) = credentials(config)? {
            builder = builder
                .with_access_key_id(credentials.key_id)
                .with_secret_access_key(credentials.secret);
            if let Some(token) = credentials.token {
                builder = builder.with_token(token);
            }
        }
        let store = builder.build().map_err(|source| BucketError::Check {
            what: "configuring the S3 client".into(),
            source,
        })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("smolder-s3")
            .enable_all()
            .build()
            .map_err(BucketError::Runtime)?;
        let endpoint = if config.endpoint.is_empty() {
            format!("AWS S3 ({})", config.region)
        } else {
            config.endpoint.clone()
        };
        let mut bucket = Bucket {
            store: Arc::new(store),
            runtime: Some(runtime),
            prefix: config.prefix.trim_matches('/').to_owned(),
            conditional: false,
            name: format!(
                "s3://{}/{} at {endpoint}",
                config.bucket,
                config.prefix.trim_matches('/')
            ),
        };
        bucket.check(config)?;
        Ok(bucket)
    }

    /// A bucket over `object_store`'s in-memory store, which honours conditional writes: for
    /// unit tests of what the store does with the bucket.
    #[cfg(test)]
    pub(crate) fn in_memory() -> Bucket {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        Bucket {
            store: Arc::new(object_store::memory::InMemory::new()),
            runtime: Some(runtime),
            prefix: String::new(),
            conditional: true,
            name: "memory".into(),
        }
    }

    /// The start's check; see [`Bucket::connect`].
    fn check(&mut self, config: &S3Config) -> Result<(), BucketError> {
        let failed = |what: &str, err: RequestError| {
            let hint = match refusal(&err.source) {
                Some(Refusal::NoBucket) => format!(
                    "bucket {:?} not found at {} (create it first)",
                    config.bucket, self.name
                ),
                Some(Refusal::Credentials) => format!(
                    "the credentials were refused by {} (check store.object-store.access-key-id, the credentials file or AWS_* in the environment, and the key's rights on the bucket)",
                    self.name
                ),
                None => format!("{} did not answer as an S3 bucket", self.name),
            };
            BucketError::Check {
                what: format!("{hint}: {what}"),
                source: err.source,
            }
        };
        self.list_page("aggregators/")
            .map_err(|err| failed("listing", err))?;
        let probe = format!("aggregators/.probe-{:016x}", rand::random::<u64>());
        self.put(&probe, Bytes::from_static(b"probe"))
            .map_err(|err| failed("writing a probe object", err))?;
        let read = self.get(&probe);
        let created = self.create(&probe, Bytes::from_static(b"again"));
        self.delete(&probe)
            .map_err(|err| failed("deleting a probe object", err))?;
        match read {
            Ok(bytes) if &bytes[..] == b"probe" => {}
            Ok(_) => {
                return Err(BucketError::Config {
                    key: "endpoint",
                    reason: format!(
                        "{} answered a probe object's read with other bytes",
                        self.name
                    ),
                });
            }
            Err(err) => return Err(failed("reading a probe object back", err)),
        }
        self.conditional = match created {
            Ok(false) => true,
            Ok(true) => false,
            Err(err) => {
                warn!(bucket = %self.name, error = %err, "conditional write probe failed; assuming the store does not honour conditional writes");
                false
            }
        };
        if self.conditional {
            info!(bucket = %self.name, "object store ready; it honours conditional writes");
        } else {
            info!(bucket = %self.name, "object store ready; it does not honour conditional writes (a second create of one key overwrote it), so no lease can be taken in it");
        }
        Ok(())
    }

    /// Whether the store honours conditional writes (found at start).
    pub(crate) fn conditional(&self) -> bool {
        self.conditional
    }

    /// What the log calls the bucket: `s3://bucket/prefix at endpoint`.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Runs `future` on the bucket's runtime (its timers and I/O) and waits for it on this
    /// thread, which must not be a runtime's worker.
    pub(crate) fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime().block_on(future)
    }

    /// The object path of `key` under the prefix.
    pub(crate) fn path(&self, key: &str) -> ObjectPath {
        object_path(&self.prefix, key)
    }

    /// `path` without the prefix; `None` for a path outside it.
    pub(crate) fn key<'p>(&self, path: &'p ObjectPath) -> Option<&'p str> {
        strip_prefix(&self.prefix, path)
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("dropped only in Drop")
    }

    /// Runs a request on the bucket's runtime and waits for it on this thread, which must not
    /// be a runtime's worker.
    fn run<T>(
        &self,
        what: &'static str,
        key: &str,
        request: impl Future<Output = object_store::Result<T>> + Send,
    ) -> Result<T, RequestError>
    where
        T: Send,
    {
        self.runtime()
            .block_on(request)
            .map_err(|source| RequestError {
                what,
                key: key.to_owned(),
                source,
            })
    }

    /// Writes object `key` whole.
    pub(crate) fn put(&self, key: &str, bytes: Bytes) -> Result<(), RequestError> {
        let path = self.path(key);
        self.run(
            "writing",
            key,
            self.store.put(&path, PutPayload::from_bytes(bytes)),
        )
        .map(|_| ())
    }

    /// Writes object `key` whole within `deadline`, retries included: a request still going
    /// then fails as timed out (the object may or may not be written).
    pub(crate) fn put_within(
        &self,
        key: &str,
        bytes: Bytes,
        deadline: Duration,
    ) -> Result<(), RequestError> {
        let path = self.path(key);
        let put = self.store.put(&path, PutPayload::from_bytes(bytes));
        self.run("writing", key, async move {
            match tokio::time::timeout(deadline, put).await {
                Ok(written) => written.map(|_| ()),
                Err(_) => Err(object_store::Error::Generic {
                    store: "S3",
                    source: format!("no answer within {deadline:?}").into(),
                }),
            }
        })
    }

    /// Writes object `key` only if it does not exist: whether it was written (`false`: it
    /// existed). A store that ignores the condition overwrites and answers `true`.
    pub(crate) fn create(&self, key: &str, bytes: Bytes) -> Result<bool, RequestError> {
        self.put_if("creating", key, bytes, PutMode::Create, |err| {
            matches!(
                err,
                object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. }
            )
        })
    }

    /// Writes object `key` under the condition `mode`: whether it was written (`false`: the
    /// store refused the condition, as `refused` tells its errors).
    fn put_if(
        &self,
        what: &'static str,
        key: &str,
        bytes: Bytes,
        mode: PutMode,
        refused: fn(&object_store::Error) -> bool,
    ) -> Result<bool, RequestError> {
        let path = self.path(key);
        let options = PutOptions::from(mode);
        match self.run(
            what,
            key,
            self.store
                .put_opts(&path, PutPayload::from_bytes(bytes), options),
        ) {
            Ok(_) => Ok(true),
            Err(err) if refused(&err.source) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Reads object `key` whole with its version: `None` when it does not exist.
    pub(crate) fn get_versioned(&self, key: &str) -> Result<Option<Versioned>, RequestError> {
        let path = self.path(key);
        let read = self.run("reading", key, async {
            let got = self.store.get(&path).await?;
            let meta = got.meta.clone();
            Ok((got.bytes().await?, meta))
        });
        match read {
            Ok((bytes, meta)) => Ok(Some(Versioned {
                bytes,
                e_tag: meta.e_tag,
                modified: u64::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0),
            })),
            Err(err) if err.not_found() => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Writes object `key` only if it is still the version whose ETag is `e_tag`: whether it
    /// was written (`false`: another writer changed or deleted it since). Only for stores that
    /// honour conditional writes ([`Bucket::conditional`]).
    pub(crate) fn update(
        &self,
        key: &str,
        bytes: Bytes,
        e_tag: &str,
    ) -> Result<bool, RequestError> {
        let mode = PutMode::Update(UpdateVersion {
            e_tag: Some(e_tag.to_owned()),
            version: None,
        });
        self.put_if("updating", key, bytes, mode, |err| {
            matches!(
                err,
                object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }
            )
        })
    }

    /// Reads object `key` whole.
    pub(crate) fn get(&self, key: &str) -> Result<Bytes, RequestError> {
        let path = self.path(key);
        self.run("reading", key, async {
            self.store.get(&path).await?.bytes().await
        })
    }

    /// Reads the bytes `range` of object `key`.
    pub(crate) fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, RequestError> {
        let path = self.path(key);
        self.run("reading part of", key, self.store.get_range(&path, range))
    }

    /// Deletes object `key`; one already gone is not an error.
    pub(crate) fn delete(&self, key: &str) -> Result<(), RequestError> {
        let path = self.path(key);
        match self.run("deleting", key, self.store.delete(&path)) {
            Err(err) if err.not_found() => Ok(()),
            other => other,
        }
    }

    /// Whether object `key` exists (a HEAD request).
    pub(crate) fn exists(&self, key: &str) -> Result<bool, RequestError> {
        let path = self.path(key);
        match self.run("reading", key, self.store.head(&path)) {
            Ok(_) => Ok(true),
            Err(err) if err.not_found() => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Every object under `prefix` (a key prefix ending in `/`), in key order.
    pub(crate) fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, RequestError> {
        let path = self.path(prefix.trim_end_matches('/'));
        self.run(
            "listing",
            prefix,
            self.store.list(Some(&path)).try_collect(),
        )
        .map(sorted)
    }

    /// The objects under `prefix` whose keys sort after `after` (a key under `prefix`), in key
    /// order: what was added since a listing, when keys grow with time.
    pub(crate) fn list_after(
        &self,
        prefix: &str,
        after: &str,
    ) -> Result<Vec<ObjectMeta>, RequestError> {
        let path = self.path(prefix.trim_end_matches('/'));
        let offset = self.path(after);
        self.run(
            "listing",
            prefix,
            self.store
                .list_with_offset(Some(&path), &offset)
                .try_collect(),
        )
        .map(sorted)
    }

    /// One listing request's worth of `prefix`: enough to know the bucket answers.
    fn list_page(&self, prefix: &str) -> Result<(), RequestError> {
        let path = self.path(prefix.trim_end_matches('/'));
        self.run(
            "listing",
            prefix,
            self.store.list_with_delimiter(Some(&path)),
        )
        .map(|_| ())
    }

    /// Starts writing object `key` in parts (S3 multipart: parts of 10 MiB uploaded as they
    /// fill).
    pub(crate) fn upload(&self, key: &str) -> Result<BucketUpload<'_>, RequestError> {
        let path = self.path(key);
        let upload = self.run("starting", key, self.store.put_multipart(&path))?;
        Ok(BucketUpload {
            bucket: self,
            key: key.to_owned(),
            writer: Some(WriteMultipart::new(upload)),
        })
    }
}

/// The object path of `key` under `prefix` (empty: none).
fn object_path(prefix: &str, key: &str) -> ObjectPath {
    if prefix.is_empty() {
        ObjectPath::from(key)
    } else {
        ObjectPath::from(format!("{prefix}/{key}"))
    }
}

/// `path` without `prefix`; `None` for a path outside it.
fn strip_prefix<'p>(prefix: &str, path: &'p ObjectPath) -> Option<&'p str> {
    let path = path.as_ref();
    if prefix.is_empty() {
        Some(path)
    } else {
        path.strip_prefix(prefix)?.strip_prefix('/')
    }
}

fn sorted(mut objects: Vec<ObjectMeta>) -> Vec<ObjectMeta> {
    objects.sort_by(|a, b| a.location.cmp(&b.location));
    objects
}

impl Drop for Bucket {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Why a store refused a request, as far as the start's check tells the operator.
enum Refusal {
    NoBucket,
    Credentials,
}

/// What `err` says of the bucket or the credentials: object_store reports a refused listing as
/// a generic error around the store's answer, so the answer's S3 error code is looked for too.
fn refusal(err: &object_store::Error) -> Option<Refusal> {
    match err {
        object_store::Error::NotFound { .. } => return Some(Refusal::NoBucket),
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => return Some(Refusal::Credentials),
        _ => {}
    }
    let text = err.to_string();
    let code = |code: &str| text.contains(&format!("<Code>{code}</Code>"));
    if code("NoSuchBucket") {
        Some(Refusal::NoBucket)
    } else if [
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
    ]
    .into_iter()
    .any(code)
        || text.contains("403 Forbidden")
        || text.contains("401 Unauthorized")
    {
        Some(Refusal::Credentials)
    } else {
        None
    }
}

/// An object being written in parts ([`Bucket::upload`]); aborted when dropped unfinished.
pub(crate) struct BucketUpload<'b> {
    bucket: &'b Bucket,
    key: String,
    writer: Option<WriteMultipart>,
}

impl BucketUpload<'_> {
    /// Appends `bytes` (a full part starts uploading in the background).
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        let _inside = self.bucket.runtime().enter();
        self.writer.as_mut().expect("not finished").write(bytes);
    }

    /// Finishes the object; stored when this returns.
    pub(crate) fn finish(mut self) -> Result<(), RequestError> {
        let writer = self.writer.take().expect("not finished");
        self.bucket
            .run("finishing", &self.key, writer.finish())
            .map(|_| ())
    }
}

impl Drop for BucketUpload<'_> {
    fn drop(&mut self) {
        if let Some(writer) = self.writer.take() {
            // The store forgets the parts; a store that keeps them until a lifecycle rule runs
            // is named in OPERATIONS.md.
            let _ = self.bucket.run("aborting", &self.key, writer.abort());
        }
    }
}

/// Access key credentials.
struct Credentials {
    key_id: String,
    secret: String,
    token: Option<String>,
}

/// The credentials of `config` or its credentials file; `None` leaves them to the environment.
fn credentials(config: &S3Config) -> Result<Option<Credentials>, BucketError> {
    match (
        config.access_key_id.is_empty(),
        config.secret_access_key.is_empty(),
    ) {
        (false, false) => {
            return Ok(Some(Credentials {
                key_id: config.access_key_id.clone(),
                secret: config.secret_access_key.clone(),
                token: None,
            }));
        }
        (false, true) | (true, false) => {
            return Err(BucketError::Config {
                key: "access-key-id",
                reason: "access-key-id and secret-access-key go together: set both or neither"
                    .into(),
            });
        }
        (true, true) => {}
    }
    if config.credentials_file.as_os_str().is_empty() {
        return Ok(None);
    }
    let path = &config.credentials_file;
    let file = std::fs::File::open(path).map_err(|source| BucketError::File {
        key: "credentials-file",
        path: path.clone(),
        source,
    })?;
    shared_credentials(std::io::BufReader::new(file), &config.credentials_profile)
        .map_err(|source| BucketError::File {
            key: "credentials-file",
            path: path.clone(),
            source,
        })?
        .map(Some)
        .ok_or_else(|| BucketError::Config {
            key: "credentials-file",
            reason: format!(
                "{} has no profile [{}] with aws_access_key_id and aws_secret_access_key",
                path.display(),
                config.credentials_profile
            ),
        })
}

/// Reads profile `profile` of an AWS shared-credentials file: `None` when it is not there or
/// lacks a key; an error for a line that is neither a section, a `key = value`, a comment nor
/// blank (named by number), and for a file larger than 1 MiB.
fn shared_credentials(reader: impl BufRead, profile: &str) -> std::io::Result<Option<Credentials>> {
    const MAX: u64 = 1 << 20;
    let mut section = None::<String>;
    let (mut key_id, mut secret, mut token) = (None, None, None);
    let mut read = 0u64;
    for (number, line) in reader.lines().enumerate() {
        let line = line?;
        read += line.len() as u64 + 1;
        if read > MAX {
            return Err(std::io::Error::other("larger than 1 MiB"));
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(name.trim().to_owned());
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            return Err(std::io::Error::other(format!(
                "line {}: neither [profile] nor key = value",
                number + 1
            )));
        };
        if section.as_deref() != Some(profile) {
            continue;
        }
        let value = value.trim().to_owned();
        match name.trim() {
            "aws_access_key_id" => key_id = Some(value),
            "aws_secret_access_key" => secret = Some(value),
            "aws_session_token" => token = Some(value),
            _ => {}
        }
    }
    Ok(key_id.zip(secret).map(|(key_id, secret)| Credentials {
        key_id,
        secret,
        token,
    }))
}

/// Builds object_store's HTTP client: reqwest 0.12 on rustls with ring, the system's roots plus
/// `ca-file`'s, and `request-timeout` for connecting and for each read.
struct Connector {
    roots: Vec<reqwest_ring::Certificate>,
    timeout: Duration,
    metrics: ObjectMetrics,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("roots", &self.roots.len())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Connector {
    fn new(config: &S3Config, metrics: ObjectMetrics) -> Result<Connector, BucketError> {
        let mut roots = Vec::new();
        if !config.ca_file.as_os_str().is_empty() {
            let path = &config.ca_file;
            let pem = read_small(path).map_err(|source| BucketError::File {
                key: "ca-file",
                path: path.clone(),
                source,
            })?;
            roots = reqwest_ring::Certificate::from_pem_bundle(&pem).map_err(|err| {
                BucketError::Config {
                    key: "ca-file",
                    reason: format!("{}: not PEM certificates: {err}", path.display()),
                }
            })?;
            if roots.is_empty() {
                return Err(BucketError::Config {
                    key: "ca-file",
                    reason: format!("{}: no certificate in it", path.display()),
                });
            }
        }
        Ok(Connector {
            roots,
            timeout: config.request_timeout,
            metrics,
        })
    }
}

/// Reads a file of at most 1 MiB.
fn read_small(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take((1 << 20) + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() > 1 << 20 {
        return Err(std::io::Error::other("larger than 1 MiB"));
    }
    Ok(bytes)
}

impl HttpConnector for Connector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        let mut builder = reqwest_ring::Client::builder()
            .connect_timeout(self.timeout)
            .read_timeout(self.timeout)
            // object_store reads a body's length from Content-Length: no decompression.
            .no_proxy();
        for root in &self.roots {
            builder = builder.add_root_certificate(root.clone());
        }
        let client = builder
            .build()
            .map_err(|err| object_store::Error::Generic {
                store: "S3",
                source: Box::new(err),
            })?;
        Ok(HttpClient::new(Service {
            client,
            metrics: self.metrics.clone(),
        }))
    }
}

/// object_store's requests through a reqwest 0.12 client, each counted: the one place every
/// request to the store passes.
struct Service {
    client: reqwest_ring::Client,
    metrics: ObjectMetrics,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl HttpService for Service {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let (parts, body) = request.into_parts();
        let op = operation(&parts.method, &parts.uri, &parts.headers);
        let url = reqwest_ring::Url::parse(&parts.uri.to_string())
            .map_err(|err| HttpError::new(HttpErrorKind::Request, err))?;
        self.metrics
            .bytes
            .with_label_values(&["sent"])
            .inc_by(body.content_length() as u64);
        let mut outgoing = reqwest_ring::Request::new(parts.method, url);
        *outgoing.headers_mut() = parts.headers;
        *outgoing.body_mut() = Some(reqwest_ring::Body::wrap(body));
        let started = std::time::Instant::now();
        let answered = self.client.execute(outgoing).await;
        self.metrics
            .duration
            .with_label_values(&[op])
            .observe(started.elapsed().as_secs_f64());
        let outcome = match &answered {
            Ok(response) => outcome(response.status()),
            Err(_) => "transport_error",
        };
        self.metrics
            .requests
            .with_label_values(&[op, outcome])
            .inc();
        let response = answered.map_err(http_error)?;
        if let Some(length) = response.content_length() {
            self.metrics
                .bytes
                .with_label_values(&["received"])
                .inc_by(length);
        }
        let response: http::Response<reqwest_ring::Body> = response.into();
        let (parts, body) = response.into_parts();
        let body = http_body_util::BodyExt::map_err(body, http_error);
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(body)))
    }
}

/// Which S3 operation a request is, as the store bills it: the label of the request metrics.
fn operation(method: &http::Method, uri: &http::Uri, headers: &http::HeaderMap) -> &'static str {
    let host = uri.host().unwrap_or_default();
    // The credential providers' requests (instance metadata, STS) go through this client too.
    if host == "169.254.169.254" || host == "[fd00:ec2::254]" || host.starts_with("sts.") {
        return "credentials";
    }
    let query = uri.query().unwrap_or_default();
    let has = |param: &str| {
        query
            .split('&')
            .any(|pair| pair.split('=').next() == Some(param))
    };
    match *method {
        http::Method::GET if has("list-type") || has("delimiter") || has("prefix") => "list",
        http::Method::GET if headers.contains_key(http::header::RANGE) => "get_range",
        http::Method::GET => "get",
        http::Method::HEAD => "head",
        http::Method::PUT if has("partNumber") => "put_part",
        http::Method::PUT if headers.contains_key("x-amz-copy-source") => "copy",
        http::Method::PUT => "put",
        http::Method::POST if has("delete") => "delete",
        http::Method::POST if has("uploads") || has("uploadId") => "multipart",
        http::Method::DELETE if has("uploadId") => "multipart",
        http::Method::DELETE => "delete",
        _ => "other",
    }
}

/// The outcome label of an answer's status.
fn outcome(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        200..=399 => "ok",
        404 => "not_found",
        409 | 412 => "precondition_failed",
        400..=499 => "client_error",
        _ => "server_error",
    }
}

/// A reqwest error as object_store classifies it for its retries.
fn http_error(err: reqwest_ring::Error) -> HttpError {
    let kind = if err.is_timeout() {
        HttpErrorKind::Timeout
    } else if err.is_connect() {
        HttpErrorKind::Connect
    } else if err.is_request() || err.is_body() {
        HttpErrorKind::Interrupted
    } else if err.is_decode() {
        HttpErrorKind::Decode
    } else {
        HttpErrorKind::Unknown
    };
    HttpError::new(kind, err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compactor_is_true_false_or_always() {
        for (text, compactor) in [
            ("false", Compactor::Never),
            ("true", Compactor::TakesTurns),
            ("always", Compactor::Always),
        ] {
            let read: Compactor = serde_norway::from_str(text).unwrap();
            assert_eq!(read, compactor);
            assert_eq!(serde_norway::to_string(&read).unwrap().trim(), text);
        }
        let err = serde_norway::from_str::<Compactor>("sometimes").unwrap_err();
        assert!(
            err.to_string()
                .contains("compactor is true, false or always, not \"sometimes\""),
            "{err}"
        );
    }

    #[test]
    fn shared_credentials_reads_the_profile_asked_for() {
        let file = "# comment\n[default]\naws_access_key_id = A\naws_secret_access_key=B\n\n[other]\naws_access_key_id = C\naws_secret_access_key = D\naws_session_token = T\n";
        let default = shared_credentials(file.as_bytes(), "default")
            .unwrap()
            .unwrap();
        assert_eq!(
            (default.key_id.as_str(), default.secret.as_str()),
            ("A", "B")
        );
        assert!(default.token.is_none());
        let other = shared_credentials(file.as_bytes(), "other")
            .unwrap()
            .unwrap();
        assert_eq!(other.token.as_deref(), Some("T"));
        assert!(
            shared_credentials(file.as_bytes(), "missing")
                .unwrap()
                .is_none()
        );
        let err = shared_credentials("[default]\nnonsense\n".as_bytes(), "default")
            .err()
            .unwrap();
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[test]
    fn intervals_are_read_in_milliseconds_or_as_durations() {
        let parse = |yaml: &str| serde_norway::from_str::<S3Config>(yaml);
        let config = parse("upload-interval: 250ms\npoll-interval: 1m").unwrap();
        assert_eq!(config.upload_interval, Duration::from_millis(250));
        assert_eq!(config.poll_interval, Duration::from_secs(60));
        assert!(parse("upload-interval: fast").is_err());
        assert!(parse("upload-interval: 1.5ms").is_err());
        let written = serde_norway::to_string(&S3Config::default()).unwrap();
        assert!(written.contains("upload-interval: 500ms"), "{written}");
        assert!(written.contains("poll-interval: 2s"), "{written}");
        assert_eq!(parse(&written).unwrap(), S3Config::default());
    }

    #[test]
    fn requests_are_named_as_the_store_bills_them() {
        let op = |method: &str, uri: &str, header: Option<&str>| {
            let mut headers = http::HeaderMap::new();
            if let Some(name) = header {
                headers.insert(
                    http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    http::HeaderValue::from_static("x"),
                );
            }
            operation(
                &http::Method::from_bytes(method.as_bytes()).unwrap(),
                &uri.parse().unwrap(),
                &headers,
            )
        };
        let b = "http://127.0.0.1:3900/smolder";
        assert_eq!(
            op("GET", &format!("{b}?list-type=2&prefix=blocks"), None),
            "list"
        );
        assert_eq!(op("GET", &format!("{b}/blocks/a.block"), None), "get");
        assert_eq!(
            op("GET", &format!("{b}/blocks/a.block"), Some("range")),
            "get_range"
        );
        assert_eq!(op("HEAD", &format!("{b}/blocks/a.block"), None), "head");
        assert_eq!(op("PUT", &format!("{b}/segments/1"), None), "put");
        assert_eq!(
            op("PUT", &format!("{b}/a?partNumber=2&uploadId=x"), None),
            "put_part"
        );
        assert_eq!(
            op("PUT", &format!("{b}/a"), Some("x-amz-copy-source")),
            "copy"
        );
        assert_eq!(op("POST", &format!("{b}/a?uploads"), None), "multipart");
        assert_eq!(op("POST", &format!("{b}/a?uploadId=x"), None), "multipart");
        assert_eq!(
            op("DELETE", &format!("{b}/a?uploadId=x"), None),
            "multipart"
        );
        assert_eq!(op("DELETE", &format!("{b}/a"), None), "delete");
        assert_eq!(op("POST", &format!("{b}?delete"), None), "delete");
        assert_eq!(
            op("GET", "http://169.254.169.254/latest/meta-data", None),
            "credentials"
        );
        assert_eq!(op("PATCH", &format!("{b}/a"), None), "other");
        assert_eq!(outcome(http::StatusCode::OK), "ok");
        assert_eq!(outcome(http::StatusCode::PARTIAL_CONTENT), "ok");
        assert_eq!(outcome(http::StatusCode::NOT_FOUND), "not_found");
        assert_eq!(
            outcome(http::StatusCode::PRECONDITION_FAILED),
            "precondition_failed"
        );
        assert_eq!(outcome(http::StatusCode::FORBIDDEN), "client_error");
        assert_eq!(
            outcome(http::StatusCode::SERVICE_UNAVAILABLE),
            "server_error"
        );
    }

    #[test]
    fn keys_go_under_the_prefix() {
        assert_eq!(object_path("", "blocks/a").as_ref(), "blocks/a");
        let path = object_path("team/x", "blocks/a");
        assert_eq!(path.as_ref(), "team/x/blocks/a");
        assert_eq!(strip_prefix("team/x", &path), Some("blocks/a"));
        assert_eq!(strip_prefix("team/y", &path), None);
        assert_eq!(strip_prefix("tea", &path), None);
        assert_eq!(strip_prefix("", &path), Some("team/x/blocks/a"));
    }
}

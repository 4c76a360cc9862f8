//! The protocol's messages, written by hand for prost like `pprof/proto.rs`, so that no protoc
//! or build script is needed. Field numbers are the protocol: never reuse or renumber one.

/// The first message on a connection: who the agent is and how it proves it may send.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Hello {
    /// The agent's persistent id (random, created on its first start with its spool).
    #[prost(string, tag = "1")]
    pub agent_id: String,
    /// The host the agent runs on, for the aggregator's logs.
    #[prost(string, tag = "2")]
    pub hostname: String,
    /// The agent's version (`CARGO_PKG_VERSION`), for the aggregator's logs.
    #[prost(string, tag = "3")]
    pub agent_version: String,
    /// A token from the aggregator's `ingest.quic.tokens`, or empty when the agent presents a
    /// client certificate instead.
    #[prost(string, tag = "4")]
    pub token: String,
}

/// The aggregator's answer to an accepted [`Hello`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct Welcome {
    /// The aggregator's version.
    #[prost(string, tag = "1")]
    pub aggregator_version: String,
    /// The largest batch body it accepts, uncompressed, in bytes.
    #[prost(uint64, tag = "2")]
    pub max_batch_bytes: u64,
    /// How many batches it serves at once on this connection (`ingest.quic.max-batches-in-flight`;
    /// the agent's `ship.max-batches-in-flight` is its own bound). Field 3 was
    /// `max_concurrent_batches`: renamed, same number, same meaning.
    #[prost(uint32, tag = "3")]
    pub max_batches_in_flight: u32,
    /// Most series one batch may carry (`ingest.max-series-per-request`); the agent splits a
    /// window into batches within it. 0 from an aggregator of v0.1, which did not announce it
    /// (and refused a batch over its default, 10 000, whole).
    #[prost(uint32, tag = "4")]
    pub max_series_per_batch: u32,
    /// Most labels one series may have (`ingest.max-labels-per-series`); 0: not announced.
    #[prost(uint32, tag = "5")]
    pub max_labels_per_series: u32,
    /// Longest label name or value, in bytes (`ingest.max-label-bytes`); 0: not announced.
    #[prost(uint32, tag = "6")]
    pub max_label_bytes: u32,
    /// The aggregator's clock as it wrote the welcome, in nanoseconds since the Unix epoch, so
    /// that the agent can measure its own clock's offset; 0: not announced.
    #[prost(int64, tag = "7")]
    pub clock_unix_nanos: i64,
    /// How far past the aggregator's clock a batch's window may end, in seconds: a batch
    /// beyond it is refused for now (retryable, code `clock_skew`); 0: not announced.
    #[prost(uint32, tag = "8")]
    pub max_clock_skew_seconds: u32,
}

/// One window's trees from one agent.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BatchMessage {
    /// The sending agent's id; with `sequence`, what makes a batch stored at most once.
    #[prost(string, tag = "1")]
    pub agent_id: String,
    /// The batch's number, from 1, increasing with every batch the agent spools (a window
    /// split into several batches takes one number per batch).
    #[prost(uint64, tag = "2")]
    pub sequence: u64,
    /// Start of the window, in nanoseconds since the Unix epoch.
    #[prost(int64, tag = "3")]
    pub start_unix_nanos: i64,
    /// End of the window (exclusive), in nanoseconds since the Unix epoch.
    #[prost(int64, tag = "4")]
    pub end_unix_nanos: i64,
    /// One entry per series.
    #[prost(message, repeated, tag = "5")]
    pub series: Vec<SeriesMessage>,
}

/// One series' tree over the batch's window.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SeriesMessage {
    /// The app name, profile type included: `checkout.cpu`.
    #[prost(string, tag = "1")]
    pub app: String,
    /// The profile type, `cpu` of `checkout.cpu`: the app name's last dot segment, or empty
    /// when it has none. Spelled out so that a reader need not know Pyroscope's convention; it
    /// must agree with `app`.
    #[prost(string, tag = "2")]
    pub profile_type: String,
    /// The series' labels, sorted by name.
    #[prost(message, repeated, tag = "3")]
    pub labels: Vec<LabelMessage>,
    /// What the values count: `samples`, `bytes`, `objects`...
    #[prost(string, tag = "4")]
    pub units: String,
    /// Samples per second of a sampled profile; 0 when values are not samples.
    #[prost(uint32, tag = "5")]
    pub sample_rate: u32,
    /// The profiler that produced the data (`ebpfspy`, `gospy`...).
    #[prost(string, tag = "6")]
    pub spy_name: String,
    /// `sum` or `average`.
    #[prost(string, tag = "7")]
    pub aggregation: String,
    /// The tree in Smolder's own encoding ([`Tree::encode`](crate::Tree::encode)).
    #[prost(bytes = "vec", tag = "8")]
    pub tree: Vec<u8>,
}

/// A label of a series.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelMessage {
    /// The label name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The label value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// The aggregator has stored a batch durably (or had stored it before: a retry): every series
/// but those in `refused`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {
    /// The acknowledged batch's sequence number.
    #[prost(uint64, tag = "1")]
    pub sequence: u64,
    /// True when the batch had been stored before and this copy was not stored again.
    #[prost(bool, tag = "2")]
    pub duplicate: bool,
    /// The series that were not stored, each with why; sending them again cannot help. At most
    /// [`MAX_LISTED`](super::limits::MAX_LISTED), the rest counted in `unlisted`, so that the
    /// ack stays a small control frame. An agent of v0.1 reads neither field: it sees the ack
    /// of a batch stored in part.
    #[prost(message, repeated, tag = "3")]
    pub refused: Vec<SeriesRefusal>,
    /// The refused series past those listed, counted per reason.
    #[prost(message, repeated, tag = "4")]
    pub unlisted: Vec<RefusalTally>,
}

/// Refused series counted, not listed: how many of one reason.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RefusalTally {
    /// A [`RefusalReason`](super::RefusalReason)'s code.
    #[prost(string, tag = "1")]
    pub reason: String,
    /// How many series.
    #[prost(uint32, tag = "2")]
    pub count: u32,
}

/// One series of a batch the aggregator did not store.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SeriesRefusal {
    /// The series' index in the batch's `series`.
    #[prost(uint32, tag = "1")]
    pub index: u32,
    /// Why, as a bounded code: a [`RefusalReason`](super::RefusalReason)'s name; a reader
    /// counts a code it does not know as `other`.
    #[prost(string, tag = "2")]
    pub reason: String,
    /// The same for a human: the limit or field at fault. Only the first few refusals of an
    /// answer carry one.
    #[prost(string, tag = "3")]
    pub message: String,
}

/// The aggregator refuses a hello or a batch.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Reject {
    /// The refused batch's sequence number; 0 for a hello or a stream that did not decode.
    #[prost(uint64, tag = "1")]
    pub sequence: u64,
    /// What was wrong, for the agent's log.
    #[prost(string, tag = "2")]
    pub reason: String,
    /// Whether sending the same thing again later can succeed (the store was unavailable, a
    /// rate limit, the agent's clock ahead of the aggregator's) or not (the batch is invalid,
    /// the credentials are wrong).
    #[prost(bool, tag = "3")]
    pub retryable: bool,
    /// `reason` as a bounded code for the agent's metrics and decisions: `too_large` (over
    /// `max_batch_bytes`: nothing was read; the agent splits the batch and sends the parts),
    /// `clock_skew`, `rate_limited`, `unavailable` (the aggregator cannot store now: its bucket
    /// does not take writes; an agent with other aggregators moves to the next), `refused`
    /// (every series refused, see `refused`), ... ([`super::reject`]). Empty from an aggregator
    /// of v0.1.
    #[prost(string, tag = "4")]
    pub code: String,
    /// With code `refused`: the batch's series, each with why, as in [`Ack::refused`].
    #[prost(message, repeated, tag = "5")]
    pub refused: Vec<SeriesRefusal>,
    /// With code `refused`: the series past those listed, as in [`Ack::unlisted`].
    #[prost(message, repeated, tag = "6")]
    pub unlisted: Vec<RefusalTally>,
}

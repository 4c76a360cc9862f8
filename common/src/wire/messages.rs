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
}

/// One window's trees from one agent.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BatchMessage {
    /// The sending agent's id; with `sequence`, what makes a batch stored at most once.
    #[prost(string, tag = "1")]
    pub agent_id: String,
    /// The batch's number, from 1, increasing by one per batch the agent spools.
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

/// The aggregator has stored a batch durably (or had stored it before: a retry).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {
    /// The acknowledged batch's sequence number.
    #[prost(uint64, tag = "1")]
    pub sequence: u64,
    /// True when the batch had been stored before and this copy was not stored again.
    #[prost(bool, tag = "2")]
    pub duplicate: bool,
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
    /// rate limit) or not (the batch is invalid, the credentials are wrong).
    #[prost(bool, tag = "3")]
    pub retryable: bool,
}

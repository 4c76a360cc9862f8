//! OTLP profiles: `ExportProfilesServiceRequest` of `profiles/v1development`, as
//! opentelemetry-proto v1.10.0 tags it, read from untrusted bodies and converted into
//! Smolder [`Profile`](crate::Profile)s.
//!
//! Input: the body of `POST /v1development/profiles` or of a gRPC `ProfilesService/Export`
//! call, already gunzipped by the caller: binary protobuf ([`decode_protobuf`]) or OTLP JSON
//! ([`decode_json`]). Output: [`Converted`] profiles, one per series, each with the
//! [`SpanTrees`](crate::SpanTrees) of its samples that ran in traced spans ([`convert`]).
//! Caller: the aggregator's ingest stage, which stores them whole or not at all.
//!
//! # Sizes before decoding
//!
//! A body larger than [`Limits::max_bytes`] is refused unread. Binary bodies are then walked
//! once without allocating ([`scan`]): the walk adds up what decoding would allocate and counts
//! samples and dictionary entries, so that [`Limits::max_samples`], [`Limits::max_entries`] and
//! a budget of [`DECODED_PER_BYTE`] × `max_bytes` for the decoded messages apply before prost
//! allocates anything. JSON bodies get the same budget from a count of where values can start:
//! every `{` taken to be the largest message, every `[` and `,` a string.
//!
//! # What does not fit is rejected
//!
//! The schema has moved between releases (`Sample.values` was field 2 in v1.9 and is 4 in
//! v1.10; field 4 was then `link_index`), and a receiver that guesses loses values silently.
//! So in the profiles messages an unknown field number, a wire type other than v1.10's, a
//! single field sent twice or an unpacked repeated number is an error naming the message and
//! field; so is every index outside its table, a dictionary whose entry 0 is not the zero
//! value, a sample without values or timestamps (or with both, of different lengths), a
//! negative value, an id of the wrong length, and a CPU sample count without a CPU period.
//! Unknown fields of the stable `common.v1`/`resource.v1` messages, and unknown JSON keys (OTLP
//! requires it; JSON is read by name, so renumbering cannot mislead it), are ignored.
//!
//! # Conversion
//!
//! See [`convert`]: sample types to series suffixes and units (eBPF sample counts with a CPU
//! period become CPU samples at `10^9 / period` Hz, answered as nanoseconds by the query path),
//! stacks through the dictionary to root-first frames, attributes to labels, `service.name` to
//! the app name, span links to span trees.

mod convert;
pub mod proto;
mod scan;

pub use convert::{Converted, convert};
pub use proto::{
    ExportProfilesPartialSuccess, ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};

use crate::series::SeriesError;

/// The bounds on one request: those of a pprof profile, read the same way
/// ([`max_bytes`](Limits::max_bytes) is the gunzipped body; samples and entries count over
/// every profile of the request; stacks deeper than
/// [`max_stack_depth`](Limits::max_stack_depth) keep their root-most frames).
pub use crate::pprof::Limits;

/// How many bytes of decoded messages one byte of body may cost: decoding is refused past
/// `DECODED_PER_BYTE × max_bytes`. The pprof decoder documents the same bound; real exports
/// (the OpenTelemetry eBPF profiler's) decode to 4 to 6 times their size, and only bodies
/// packed with empty messages come near 16.
pub const DECODED_PER_BYTE: usize = 16;

/// Why a request was refused. Every variant means a bad request (HTTP 400, gRPC
/// `InvalidArgument`) except those of [`is_too_large`](Self::is_too_large) (HTTP 413, gRPC
/// `ResourceExhausted`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtlpError {
    /// The body is larger than [`Limits::max_bytes`].
    #[error("request is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// Decoding would allocate more than [`DECODED_PER_BYTE`] × [`Limits::max_bytes`].
    #[error("request would decode to more than the limit of {limit} bytes")]
    TooExpensive {
        /// The limit, in bytes.
        limit: usize,
    },
    /// More samples than [`Limits::max_samples`].
    #[error("request has more samples than the limit of {limit}")]
    TooManySamples {
        /// The limit.
        limit: usize,
    },
    /// More dictionary entries than [`Limits::max_entries`].
    #[error("request has more dictionary entries than the limit of {limit}")]
    TooManyEntries {
        /// The limit.
        limit: usize,
    },
    /// Messages nested deeper than any v1.10 request needs.
    #[error("request nests messages deeper than {limit} levels")]
    TooDeep {
        /// The deepest nesting accepted.
        limit: usize,
    },
    /// The bytes are not protobuf.
    #[error("malformed protobuf at byte {offset}: {reason}")]
    Malformed {
        /// Where the problem is.
        offset: usize,
        /// What it is.
        reason: &'static str,
    },
    /// A field number v1.10 does not have in a profiles message.
    #[error(
        "{message} has no field {field} in profiles/v1development as of opentelemetry-proto v1.10; the sender speaks another release"
    )]
    UnknownField {
        /// The message, `Sample`.
        message: &'static str,
        /// The field number.
        field: u32,
    },
    /// A field of another wire type than v1.10's.
    #[error(
        "field {field} of {message} is {found}, but {expected} in profiles/v1development as of opentelemetry-proto v1.10 (repeated numbers must be packed); the sender speaks another release"
    )]
    WireType {
        /// The message.
        message: &'static str,
        /// The field number.
        field: u32,
        /// The wire type found.
        found: &'static str,
        /// The wire type of v1.10.
        expected: &'static str,
    },
    /// A single-valued field sent more than once.
    #[error(
        "field {field} of {message} appears more than once, but holds one value in profiles/v1development as of opentelemetry-proto v1.10"
    )]
    RepeatedField {
        /// The message.
        message: &'static str,
        /// The field number.
        field: u32,
    },
    /// prost could not decode the body.
    #[error("invalid protobuf")]
    Protobuf {
        /// prost's error.
        source: prost::DecodeError,
    },
    /// The body is not OTLP JSON.
    #[error("invalid json")]
    Json {
        /// serde_json's error, with line and column.
        source: serde_json::Error,
    },
    /// The request has no dictionary.
    #[error("request has no dictionary (ExportProfilesServiceRequest.dictionary is required)")]
    MissingDictionary,
    /// Entry 0 of a dictionary table is missing (the string table) or not the zero value.
    #[error("dictionary {table}[0] must be present and the zero value")]
    ZeroEntry {
        /// The table, `string_table`.
        table: &'static str,
    },
    /// An index outside its table.
    #[error("{field} is {index}, outside {table} of {len} entries")]
    Index {
        /// Where the index is, `resource_profiles[0].scope_profiles[0].profiles[1].samples[7].stack_index`.
        field: String,
        /// The index found.
        index: i64,
        /// The table, `stack_table`.
        table: &'static str,
        /// The table's length.
        len: usize,
    },
    /// A profile has no sample type.
    #[error("{profile} has no sample_type")]
    MissingSampleType {
        /// The profile, `resource_profiles[0].scope_profiles[0].profiles[1]`.
        profile: String,
    },
    /// A profile's sample type has an empty name.
    #[error("{profile} has a sample type with no name")]
    UnnamedSampleType {
        /// The profile.
        profile: String,
    },
    /// Sample counts (`samples`/`count`) without a CPU period to turn them into time.
    #[error(
        "{profile} counts samples (samples/count) but has no period of type cpu in a time unit to turn them into cpu time"
    )]
    NoCpuPeriod {
        /// The profile.
        profile: String,
    },
    /// A CPU period that is not between a nanosecond and a second.
    #[error("{profile} has a period of {period} {unit}, not between 1 ns and 1 s")]
    BadPeriod {
        /// The profile.
        profile: String,
        /// The period.
        period: i64,
        /// Its unit.
        unit: String,
    },
    /// A sample with neither values nor timestamps.
    #[error("{sample} has neither values nor timestamps")]
    NoValues {
        /// The sample, `….profiles[1].samples[7]`.
        sample: String,
    },
    /// A sample whose values and timestamps differ in number.
    #[error("{sample} has {values} values but {timestamps} timestamps")]
    ValueCount {
        /// The sample.
        sample: String,
        /// Its values.
        values: usize,
        /// Its timestamps.
        timestamps: usize,
    },
    /// A negative value.
    #[error("{sample} has negative value {value}")]
    NegativeValue {
        /// The sample.
        sample: String,
        /// The value.
        value: i64,
    },
    /// Values whose sum does not fit 64 bits.
    #[error("{sample} has values that add up past 2^64")]
    ValueOverflow {
        /// The sample.
        sample: String,
    },
    /// A trace, span or profile id of the wrong length.
    #[error("{field} has {len} bytes, expected {expected}")]
    BadId {
        /// The field, `link_table[3].span_id`.
        field: String,
        /// Its length.
        len: usize,
        /// The length the schema gives it.
        expected: &'static str,
    },
    /// An attribute with both `key` and `key_strindex` set.
    #[error("{field} sets both key and key_strindex")]
    AmbiguousKey {
        /// The attribute.
        field: String,
    },
    /// The series a profile converts to cannot be named.
    #[error("cannot name series {name:?}")]
    Series {
        /// The app name.
        name: String,
        /// Why.
        source: SeriesError,
    },
}

impl OtlpError {
    /// Whether the request is refused for its size rather than its content (HTTP 413).
    pub fn is_too_large(&self) -> bool {
        matches!(
            self,
            OtlpError::TooLarge { .. }
                | OtlpError::TooExpensive { .. }
                | OtlpError::TooManySamples { .. }
                | OtlpError::TooManyEntries { .. }
        )
    }
}

/// Decodes a binary protobuf body, after [`scan`] has checked it against the schema and
/// `limits`.
///
/// # Errors
///
/// [`OtlpError::TooLarge`] and the errors of [`scan`] before anything is allocated, then
/// [`OtlpError::Protobuf`].
pub fn decode_protobuf(
    body: &[u8],
    limits: &Limits,
) -> Result<ExportProfilesServiceRequest, OtlpError> {
    use prost::Message;

    if body.len() > limits.max_bytes {
        return Err(OtlpError::TooLarge {
            limit: limits.max_bytes,
        });
    }
    scan::scan(body, limits)?;
    ExportProfilesServiceRequest::decode(body).map_err(|source| OtlpError::Protobuf { source })
}

/// The largest decoded message, which a JSON value is assumed to be.
const LARGEST_MESSAGE: usize = {
    use std::mem::size_of;
    let sizes = [
        size_of::<proto::Profile>(),
        size_of::<proto::ProfilesDictionary>(),
        size_of::<proto::ResourceProfiles>(),
        size_of::<proto::ScopeProfiles>(),
        size_of::<proto::Sample>(),
        size_of::<proto::Location>(),
        size_of::<proto::Mapping>(),
        size_of::<proto::KeyValue>(),
        size_of::<proto::KeyValueAndUnit>(),
        size_of::<proto::InstrumentationScope>(),
        size_of::<proto::AnyValue>(),
    ];
    let mut largest = 0;
    let mut i = 0;
    while i < sizes.len() {
        if sizes[i] > largest {
            largest = sizes[i];
        }
        i += 1;
    }
    largest
};

/// Decodes an OTLP JSON body under `limits` (see the [module documentation](self)).
///
/// # Errors
///
/// [`OtlpError::TooLarge`] or [`OtlpError::TooExpensive`] before decoding,
/// [`OtlpError::Json`], then [`OtlpError::TooManySamples`] or [`OtlpError::TooManyEntries`].
pub fn decode_json(
    body: &[u8],
    limits: &Limits,
) -> Result<ExportProfilesServiceRequest, OtlpError> {
    if body.len() > limits.max_bytes {
        return Err(OtlpError::TooLarge {
            limit: limits.max_bytes,
        });
    }
    let budget = limits.max_bytes.saturating_mul(DECODED_PER_BYTE);
    // Every message opens with `{`; every other list element (a number, a string) follows a
    // `,` or opens its list, and takes at most a `String`'s size besides its bytes.
    let (mut objects, mut elements) = (0usize, 0usize);
    for &b in body {
        match b {
            b'{' => objects += 1,
            b'[' | b',' => elements += 1,
            _ => {}
        }
    }
    let estimate = objects
        .saturating_mul(LARGEST_MESSAGE)
        .saturating_add(elements.saturating_mul(std::mem::size_of::<String>()))
        .saturating_add(body.len());
    if estimate > budget {
        return Err(OtlpError::TooExpensive { limit: budget });
    }
    let request: ExportProfilesServiceRequest =
        serde_json::from_slice(body).map_err(|source| OtlpError::Json { source })?;
    let samples: usize = request
        .resource_profiles
        .iter()
        .flat_map(|r| &r.scope_profiles)
        .flat_map(|s| &s.profiles)
        .map(|p| p.samples.len())
        .sum();
    if samples > limits.max_samples {
        return Err(OtlpError::TooManySamples {
            limit: limits.max_samples,
        });
    }
    if let Some(d) = &request.dictionary {
        let entries = d.mapping_table.len()
            + d.location_table.len()
            + d.function_table.len()
            + d.link_table.len()
            + d.string_table.len()
            + d.attribute_table.len()
            + d.stack_table.len();
        if entries > limits.max_entries {
            return Err(OtlpError::TooManyEntries {
                limit: limits.max_entries,
            });
        }
    }
    Ok(request)
}

#[cfg(test)]
mod tests;

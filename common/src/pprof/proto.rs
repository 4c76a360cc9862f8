//! The pprof messages, written by hand from `perftools.profiles` (`proto/profile.proto` in
//! google/pprof) so that no protoc or build script is needed.
//!
//! Field numbers and types follow the upstream file exactly. Repeated scalars are packed, as in
//! proto3; prost also accepts the unpacked form when decoding. Fields this crate never reads
//! (`Sample.breakdown`, `Profile.label_set`, `Profile.tick_unit`, added upstream later) are left
//! out: prost skips unknown fields.
//!
//! One deliberate difference: the string table is `repeated bytes`, not `repeated string`. Both
//! have the same wire encoding, and real profiles do carry invalid UTF-8 (Pyroscope keeps a test
//! for it); decoding it as `string` would reject the whole profile for one bad symbol, so names
//! are converted lossily where they are used instead.
//!
//! The messages also read and write the proto3 JSON mapping ([`protojson`]), for
//! `SelectMergeProfile` answers in Connect's JSON codec (`google.v1.Profile` is this message);
//! there the string table is a list of strings, invalid UTF-8 replaced.

use serde::{Deserialize, Serialize};

use crate::protojson;

/// The string table as JSON strings: written lossily, read as UTF-8 bytes.
mod strings {
    use serde::ser::SerializeSeq;
    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(table: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(table.len()))?;
        for entry in table {
            seq.serialize_element(&String::from_utf8_lossy(entry))?;
        }
        seq.end()
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
        let table: Vec<String> = crate::protojson::nullable(d)?;
        Ok(table.into_iter().map(String::into_bytes).collect())
    }
}

/// A profile: sample types, samples, and the tables the samples point into.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Profile {
    /// What each `Sample.value` means, one entry per value.
    #[prost(message, repeated, tag = "1")]
    #[serde(alias = "sample_type", deserialize_with = "protojson::nullable")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub sample: Vec<Sample>,
    /// Address ranges and the binaries mapped into them.
    #[prost(message, repeated, tag = "3")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub mapping: Vec<Mapping>,
    /// Program locations, referenced by `Sample.location_id`.
    #[prost(message, repeated, tag = "4")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub location: Vec<Location>,
    /// Functions, referenced by `Line.function_id`.
    #[prost(message, repeated, tag = "5")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub function: Vec<Function>,
    /// Every string of the profile; entry 0 must be empty. Bytes, not `String`: see the module
    /// documentation.
    #[prost(bytes = "vec", repeated, tag = "6")]
    #[serde(alias = "string_table", with = "strings")]
    pub string_table: Vec<Vec<u8>>,
    /// Index into the string table of a regexp of frames to drop.
    #[prost(int64, tag = "7")]
    #[serde(
        alias = "drop_frames",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub drop_frames: i64,
    /// Index into the string table of a regexp of frames to keep.
    #[prost(int64, tag = "8")]
    #[serde(
        alias = "keep_frames",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub keep_frames: i64,
    /// When collection started, in nanoseconds since the Unix epoch.
    #[prost(int64, tag = "9")]
    #[serde(
        alias = "time_nanos",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub time_nanos: i64,
    /// How long collection lasted, in nanoseconds.
    #[prost(int64, tag = "10")]
    #[serde(
        alias = "duration_nanos",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub duration_nanos: i64,
    /// The kind of events between sampled occurrences, for example `cpu`/`nanoseconds`.
    #[prost(message, optional, tag = "11")]
    #[serde(alias = "period_type", skip_serializing_if = "Option::is_none")]
    pub period_type: Option<ValueType>,
    /// The number of events between sampled occurrences, in `period_type` units.
    #[prost(int64, tag = "12")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub period: i64,
    /// Free-form comments, as indices into the string table.
    #[prost(int64, repeated, tag = "13")]
    #[serde(
        serialize_with = "protojson::as_strings",
        deserialize_with = "protojson::integers"
    )]
    pub comment: Vec<i64>,
    /// Index into the string table of the preferred sample type.
    #[prost(int64, tag = "14")]
    #[serde(
        alias = "default_sample_type",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub default_sample_type: i64,
}

/// The meaning and unit of a value, as indices into the string table.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ValueType {
    /// The type, for example `samples` or `alloc_space`.
    #[prost(int64, tag = "1")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub r#type: i64,
    /// The unit, for example `count` or `bytes`.
    #[prost(int64, tag = "2")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub unit: i64,
}

/// One stack with its values and labels.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Sample {
    /// Location ids, **leaf first**.
    #[prost(uint64, repeated, tag = "1")]
    #[serde(
        alias = "location_id",
        serialize_with = "protojson::as_strings",
        deserialize_with = "protojson::integers"
    )]
    pub location_id: Vec<u64>,
    /// One value per `Profile.sample_type`.
    #[prost(int64, repeated, tag = "2")]
    #[serde(
        serialize_with = "protojson::as_strings",
        deserialize_with = "protojson::integers"
    )]
    pub value: Vec<i64>,
    /// Labels: string labels (`str`) or numeric ones (`num`).
    #[prost(message, repeated, tag = "3")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub label: Vec<Label>,
}

/// A sample label. At most one of `str` and `num` is set.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Label {
    /// Index into the string table of the key.
    #[prost(int64, tag = "1")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub key: i64,
    /// Index into the string table of the value, for string labels.
    #[prost(int64, tag = "2")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub str: i64,
    /// The value, for numeric labels.
    #[prost(int64, tag = "3")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub num: i64,
    /// Index into the string table of the unit of `num`.
    #[prost(int64, tag = "4")]
    #[serde(
        alias = "num_unit",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub num_unit: i64,
}

/// A binary or library mapped into the address space.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Mapping {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub id: u64,
    /// The address the mapping starts at.
    #[prost(uint64, tag = "2")]
    #[serde(
        alias = "memory_start",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub memory_start: u64,
    /// The address the mapping ends at.
    #[prost(uint64, tag = "3")]
    #[serde(
        alias = "memory_limit",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub memory_limit: u64,
    /// The offset in the file of the first mapped byte.
    #[prost(uint64, tag = "4")]
    #[serde(
        alias = "file_offset",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub file_offset: u64,
    /// Index into the string table of the file name.
    #[prost(int64, tag = "5")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub filename: i64,
    /// Index into the string table of the build id.
    #[prost(int64, tag = "6")]
    #[serde(
        alias = "build_id",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub build_id: i64,
    /// Whether locations in this mapping have function names.
    #[prost(bool, tag = "7")]
    #[serde(alias = "has_functions", deserialize_with = "protojson::nullable")]
    pub has_functions: bool,
    /// Whether locations in this mapping have file names.
    #[prost(bool, tag = "8")]
    #[serde(alias = "has_filenames", deserialize_with = "protojson::nullable")]
    pub has_filenames: bool,
    /// Whether locations in this mapping have line numbers.
    #[prost(bool, tag = "9")]
    #[serde(alias = "has_line_numbers", deserialize_with = "protojson::nullable")]
    pub has_line_numbers: bool,
    /// Whether locations in this mapping have inlined frames.
    #[prost(bool, tag = "10")]
    #[serde(alias = "has_inline_frames", deserialize_with = "protojson::nullable")]
    pub has_inline_frames: bool,
}

/// A program location: an address and the functions (inlined ones first) at it.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Location {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub id: u64,
    /// The mapping holding `address`, or 0 when unknown.
    #[prost(uint64, tag = "2")]
    #[serde(
        alias = "mapping_id",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub mapping_id: u64,
    /// The instruction address, if known.
    #[prost(uint64, tag = "3")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub address: u64,
    /// The functions at this address, **innermost first**: every line but the last was inlined
    /// into the one after it, and the last is the caller.
    #[prost(message, repeated, tag = "4")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub line: Vec<Line>,
    /// Whether several symbols share this address (identical code folding).
    #[prost(bool, tag = "5")]
    #[serde(alias = "is_folded", deserialize_with = "protojson::nullable")]
    pub is_folded: bool,
}

/// A function and line within a [`Location`].
#[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Line {
    /// The function's id.
    #[prost(uint64, tag = "1")]
    #[serde(
        alias = "function_id",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub function_id: u64,
    /// The source line number.
    #[prost(int64, tag = "2")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub line: i64,
    /// The source column number. Left out of JSON when 0, as proto3's JSON mapping leaves out
    /// default values: Pyroscope's `google.v1.Line` has no column, and a strict protojson
    /// client (Google's runtime, connect-python) rejects a field its schema lacks.
    #[prost(int64, tag = "3")]
    #[serde(
        skip_serializing_if = "is_zero",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub column: i64,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// A function.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Function {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub id: u64,
    /// Index into the string table of the human-readable name.
    #[prost(int64, tag = "2")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub name: i64,
    /// Index into the string table of the system name (for example the mangled name).
    #[prost(int64, tag = "3")]
    #[serde(
        alias = "system_name",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub system_name: i64,
    /// Index into the string table of the source file name.
    #[prost(int64, tag = "4")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub filename: i64,
    /// The line the function starts at.
    #[prost(int64, tag = "5")]
    #[serde(
        alias = "start_line",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub start_line: i64,
}

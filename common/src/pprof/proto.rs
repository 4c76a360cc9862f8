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

/// A profile: sample types, samples, and the tables the samples point into.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    /// What each `Sample.value` means, one entry per value.
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// Address ranges and the binaries mapped into them.
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// Program locations, referenced by `Sample.location_id`.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Functions, referenced by `Line.function_id`.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Every string of the profile; entry 0 must be empty. Bytes, not `String`: see the module
    /// documentation.
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub string_table: Vec<Vec<u8>>,
    /// Index into the string table of a regexp of frames to drop.
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    /// Index into the string table of a regexp of frames to keep.
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    /// When collection started, in nanoseconds since the Unix epoch.
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// How long collection lasted, in nanoseconds.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// The kind of events between sampled occurrences, for example `cpu`/`nanoseconds`.
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// The number of events between sampled occurrences, in `period_type` units.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// Free-form comments, as indices into the string table.
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    /// Index into the string table of the preferred sample type.
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// The meaning and unit of a value, as indices into the string table.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct ValueType {
    /// The type, for example `samples` or `alloc_space`.
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// The unit, for example `count` or `bytes`.
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// One stack with its values and labels.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Location ids, **leaf first**.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per `Profile.sample_type`.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// Labels: string labels (`str`) or numeric ones (`num`).
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// A sample label. At most one of `str` and `num` is set.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Label {
    /// Index into the string table of the key.
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// Index into the string table of the value, for string labels.
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// The value, for numeric labels.
    #[prost(int64, tag = "3")]
    pub num: i64,
    /// Index into the string table of the unit of `num`.
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// A binary or library mapped into the address space.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Mapping {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// The address the mapping starts at.
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// The address the mapping ends at.
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// The offset in the file of the first mapped byte.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// Index into the string table of the file name.
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// Index into the string table of the build id.
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// Whether locations in this mapping have function names.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    /// Whether locations in this mapping have file names.
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    /// Whether locations in this mapping have line numbers.
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    /// Whether locations in this mapping have inlined frames.
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// A program location: an address and the functions (inlined ones first) at it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// The mapping holding `address`, or 0 when unknown.
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// The instruction address, if known.
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// The functions at this address, **innermost first**: every line but the last was inlined
    /// into the one after it, and the last is the caller.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    /// Whether several symbols share this address (identical code folding).
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// A function and line within a [`Location`].
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Line {
    /// The function's id.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// The source line number.
    #[prost(int64, tag = "2")]
    pub line: i64,
    /// The source column number.
    #[prost(int64, tag = "3")]
    pub column: i64,
}

/// A function.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Function {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Index into the string table of the human-readable name.
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// Index into the string table of the system name (for example the mangled name).
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    /// Index into the string table of the source file name.
    #[prost(int64, tag = "4")]
    pub filename: i64,
    /// The line the function starts at.
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

//! The messages of OTLP profiles, `profiles/v1development` as tagged in opentelemetry-proto
//! v1.10.0 (v1.11.0 changed only comments), with the `common.v1` and `resource.v1` messages
//! they embed, written by hand for prost and serde. Field numbers are the schema: they moved
//! between releases, which is why [`scan`](super::scan) checks every one before decoding.
//!
//! JSON follows OTLP's encoding: lowerCamelCase names (the proto names are read too), 64-bit
//! integers as decimal strings (numbers read too), enums as numbers, and `traceId`, `spanId`
//! and `profileId` in hex ([`protojson::otlp_id`], which also reads base64).

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::protojson;

/// `ExportProfilesServiceRequest`: what `ProfilesService/Export` and `POST
/// /v1development/profiles` carry.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ExportProfilesServiceRequest {
    /// The profiles, per resource.
    #[prost(message, repeated, tag = "1")]
    #[serde(alias = "resource_profiles", deserialize_with = "protojson::nullable")]
    pub resource_profiles: Vec<ResourceProfiles>,
    /// The tables every profile of the request points into; required.
    #[prost(message, optional, tag = "2")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dictionary: Option<ProfilesDictionary>,
}

/// `ExportProfilesServiceResponse`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ExportProfilesServiceResponse {
    /// Set when some profiles were rejected (Smolder refuses profiles over its limits one by
    /// one and stores the others).
    #[prost(message, optional, tag = "1")]
    #[serde(alias = "partial_success", skip_serializing_if = "Option::is_none")]
    pub partial_success: Option<ExportProfilesPartialSuccess>,
}

/// `ExportProfilesPartialSuccess`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ExportProfilesPartialSuccess {
    /// How many profiles were rejected.
    #[prost(int64, tag = "1")]
    #[serde(
        alias = "rejected_profiles",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub rejected_profiles: i64,
    /// Why.
    #[prost(string, tag = "2")]
    #[serde(alias = "error_message", deserialize_with = "protojson::nullable")]
    pub error_message: String,
}

/// `ProfilesDictionary`: the tables shared by every profile of a request. Entry 0 of every
/// table is the zero value, so that index 0 means "none".
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProfilesDictionary {
    /// Mapped binaries, referenced by `Location.mapping_index`.
    #[prost(message, repeated, tag = "1")]
    #[serde(alias = "mapping_table", deserialize_with = "protojson::nullable")]
    pub mapping_table: Vec<Mapping>,
    /// Locations, referenced by `Stack.location_indices`.
    #[prost(message, repeated, tag = "2")]
    #[serde(alias = "location_table", deserialize_with = "protojson::nullable")]
    pub location_table: Vec<Location>,
    /// Functions, referenced by `Line.function_index`.
    #[prost(message, repeated, tag = "3")]
    #[serde(alias = "function_table", deserialize_with = "protojson::nullable")]
    pub function_table: Vec<Function>,
    /// Links to spans, referenced by `Sample.link_index`.
    #[prost(message, repeated, tag = "4")]
    #[serde(alias = "link_table", deserialize_with = "protojson::nullable")]
    pub link_table: Vec<Link>,
    /// Every string; entry 0 is `""`.
    #[prost(string, repeated, tag = "5")]
    #[serde(alias = "string_table", deserialize_with = "protojson::nullable")]
    pub string_table: Vec<String>,
    /// Attributes, referenced by every `attribute_indices`.
    #[prost(message, repeated, tag = "6")]
    #[serde(alias = "attribute_table", deserialize_with = "protojson::nullable")]
    pub attribute_table: Vec<KeyValueAndUnit>,
    /// Stacks, referenced by `Sample.stack_index`.
    #[prost(message, repeated, tag = "7")]
    #[serde(alias = "stack_table", deserialize_with = "protojson::nullable")]
    pub stack_table: Vec<Stack>,
}

/// `ResourceProfiles`: the profiles of one resource (a process, a container, a host).
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ResourceProfiles {
    /// The resource; its attributes become labels.
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<Resource>,
    /// The profiles, per instrumentation scope.
    #[prost(message, repeated, tag = "2")]
    #[serde(alias = "scope_profiles", deserialize_with = "protojson::nullable")]
    pub scope_profiles: Vec<ScopeProfiles>,
    /// The resource's schema URL.
    #[prost(string, tag = "3")]
    #[serde(alias = "schema_url", deserialize_with = "protojson::nullable")]
    pub schema_url: String,
}

/// `ScopeProfiles`: the profiles of one instrumentation scope.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ScopeProfiles {
    /// The scope; its attributes become labels.
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<InstrumentationScope>,
    /// The profiles.
    #[prost(message, repeated, tag = "2")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub profiles: Vec<Profile>,
    /// The scope's schema URL.
    #[prost(string, tag = "3")]
    #[serde(alias = "schema_url", deserialize_with = "protojson::nullable")]
    pub schema_url: String,
}

/// `Profile`: samples of one sample type.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Profile {
    /// What every value is, as string indices: `samples`/`count`, `cpu`/`nanoseconds`.
    #[prost(message, optional, tag = "1")]
    #[serde(alias = "sample_type", skip_serializing_if = "Option::is_none")]
    pub sample_type: Option<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub samples: Vec<Sample>,
    /// When collection started, in nanoseconds since the Unix epoch.
    #[prost(fixed64, tag = "3")]
    #[serde(
        alias = "time_unix_nano",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub time_unix_nano: u64,
    /// How long collection lasted, in nanoseconds.
    #[prost(uint64, tag = "4")]
    #[serde(
        alias = "duration_nano",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub duration_nano: u64,
    /// The kind of event between samples, as string indices: `cpu`/`nanoseconds`.
    #[prost(message, optional, tag = "5")]
    #[serde(alias = "period_type", skip_serializing_if = "Option::is_none")]
    pub period_type: Option<ValueType>,
    /// The number of `period_type` units between samples.
    #[prost(int64, tag = "6")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub period: i64,
    /// A 16-byte id, or empty.
    #[prost(bytes = "vec", tag = "7")]
    #[serde(alias = "profile_id", with = "protojson::otlp_id")]
    pub profile_id: Vec<u8>,
    /// Attributes the sender dropped.
    #[prost(uint32, tag = "8")]
    #[serde(
        alias = "dropped_attributes_count",
        deserialize_with = "protojson::integer"
    )]
    pub dropped_attributes_count: u32,
    /// The format of `original_payload`, if any (`pprof`, `jfr`).
    #[prost(string, tag = "9")]
    #[serde(
        alias = "original_payload_format",
        deserialize_with = "protojson::nullable"
    )]
    pub original_payload_format: String,
    /// The profile as first recorded; Smolder does not keep it.
    #[prost(bytes = "vec", tag = "10")]
    #[serde(alias = "original_payload", with = "protojson::base64")]
    pub original_payload: Vec<u8>,
    /// The profile's attributes, as indices into the attribute table.
    #[prost(int32, repeated, tag = "11")]
    #[serde(alias = "attribute_indices", deserialize_with = "protojson::integers")]
    pub attribute_indices: Vec<i32>,
}

/// `Link`: the span a sample ran in.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Link {
    /// The trace id, 16 bytes.
    #[prost(bytes = "vec", tag = "1")]
    #[serde(alias = "trace_id", with = "protojson::otlp_id")]
    pub trace_id: Vec<u8>,
    /// The span id, 8 bytes.
    #[prost(bytes = "vec", tag = "2")]
    #[serde(alias = "span_id", with = "protojson::otlp_id")]
    pub span_id: Vec<u8>,
}

/// `ValueType`: a type and unit, as string indices.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ValueType {
    /// The type, `cpu`.
    #[prost(int32, tag = "1")]
    #[serde(alias = "type_strindex", deserialize_with = "protojson::integer")]
    pub type_strindex: i32,
    /// The unit, `nanoseconds`.
    #[prost(int32, tag = "2")]
    #[serde(alias = "unit_strindex", deserialize_with = "protojson::integer")]
    pub unit_strindex: i32,
}

/// `Sample`: a stack, its attributes and span, and its values or timestamps.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Sample {
    /// The stack, as an index into the stack table.
    #[prost(int32, tag = "1")]
    #[serde(alias = "stack_index", deserialize_with = "protojson::integer")]
    pub stack_index: i32,
    /// The sample's attributes, as indices into the attribute table.
    #[prost(int32, repeated, tag = "2")]
    #[serde(alias = "attribute_indices", deserialize_with = "protojson::integers")]
    pub attribute_indices: Vec<i32>,
    /// The span, as an index into the link table; 0 for none.
    #[prost(int32, tag = "3")]
    #[serde(alias = "link_index", deserialize_with = "protojson::integer")]
    pub link_index: i32,
    /// One value per observation, in the profile's sample type.
    #[prost(int64, repeated, tag = "4")]
    #[serde(
        serialize_with = "protojson::as_strings",
        deserialize_with = "protojson::integers"
    )]
    pub values: Vec<i64>,
    /// One time per observation, in nanoseconds since the Unix epoch; an observation without
    /// a value counts 1.
    #[prost(fixed64, repeated, tag = "5")]
    #[serde(
        alias = "timestamps_unix_nano",
        serialize_with = "protojson::as_strings",
        deserialize_with = "protojson::integers"
    )]
    pub timestamps_unix_nano: Vec<u64>,
}

/// `Mapping`: a binary mapped into memory.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Mapping {
    /// Where the mapping starts.
    #[prost(uint64, tag = "1")]
    #[serde(
        alias = "memory_start",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub memory_start: u64,
    /// Where it ends.
    #[prost(uint64, tag = "2")]
    #[serde(
        alias = "memory_limit",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub memory_limit: u64,
    /// The file offset of its first byte.
    #[prost(uint64, tag = "3")]
    #[serde(
        alias = "file_offset",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub file_offset: u64,
    /// The file's name, as a string index.
    #[prost(int32, tag = "4")]
    #[serde(alias = "filename_strindex", deserialize_with = "protojson::integer")]
    pub filename_strindex: i32,
    /// Attributes (a build id), as indices into the attribute table.
    #[prost(int32, repeated, tag = "5")]
    #[serde(alias = "attribute_indices", deserialize_with = "protojson::integers")]
    pub attribute_indices: Vec<i32>,
}

/// `Stack`: locations, leaf first.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Stack {
    /// Indices into the location table, leaf first.
    #[prost(int32, repeated, tag = "1")]
    #[serde(alias = "location_indices", deserialize_with = "protojson::integers")]
    pub location_indices: Vec<i32>,
}

/// `Location`: an address and the functions at it.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Location {
    /// The mapping, as an index into the mapping table; 0 for none.
    #[prost(int32, tag = "1")]
    #[serde(alias = "mapping_index", deserialize_with = "protojson::integer")]
    pub mapping_index: i32,
    /// The instruction address.
    #[prost(uint64, tag = "2")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub address: u64,
    /// The functions at the address, inlined ones first, the caller last.
    #[prost(message, repeated, tag = "3")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub lines: Vec<Line>,
    /// Attributes (a frame type), as indices into the attribute table.
    #[prost(int32, repeated, tag = "4")]
    #[serde(alias = "attribute_indices", deserialize_with = "protojson::integers")]
    pub attribute_indices: Vec<i32>,
}

/// `Line`: a function and a source position.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Line {
    /// The function, as an index into the function table; 0 for none.
    #[prost(int32, tag = "1")]
    #[serde(alias = "function_index", deserialize_with = "protojson::integer")]
    pub function_index: i32,
    /// The source line; 0 if unknown.
    #[prost(int64, tag = "2")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub line: i64,
    /// The source column; 0 if unknown.
    #[prost(int64, tag = "3")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub column: i64,
}

/// `Function`: names and a file, as string indices.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Function {
    /// The readable name.
    #[prost(int32, tag = "1")]
    #[serde(alias = "name_strindex", deserialize_with = "protojson::integer")]
    pub name_strindex: i32,
    /// The system's name (a mangled one).
    #[prost(int32, tag = "2")]
    #[serde(
        alias = "system_name_strindex",
        deserialize_with = "protojson::integer"
    )]
    pub system_name_strindex: i32,
    /// The source file.
    #[prost(int32, tag = "3")]
    #[serde(alias = "filename_strindex", deserialize_with = "protojson::integer")]
    pub filename_strindex: i32,
    /// The first line.
    #[prost(int64, tag = "4")]
    #[serde(
        alias = "start_line",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub start_line: i64,
}

/// `KeyValueAndUnit`: an attribute of the attribute table.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KeyValueAndUnit {
    /// The key, as a string index.
    #[prost(int32, tag = "1")]
    #[serde(alias = "key_strindex", deserialize_with = "protojson::integer")]
    pub key_strindex: i32,
    /// The value.
    #[prost(message, optional, tag = "2")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<AnyValue>,
    /// The unit, as a string index; 0 for none.
    #[prost(int32, tag = "3")]
    #[serde(alias = "unit_strindex", deserialize_with = "protojson::integer")]
    pub unit_strindex: i32,
}

/// `common.v1.AnyValue`: one value of one of eight kinds, or none.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AnyValue {
    /// The value.
    #[prost(oneof = "Value", tags = "1, 2, 3, 4, 5, 6, 7, 8")]
    pub value: Option<Value>,
}

/// The kinds of an [`AnyValue`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    /// A string.
    #[prost(string, tag = "1")]
    StringValue(String),
    /// A boolean.
    #[prost(bool, tag = "2")]
    BoolValue(bool),
    /// An integer.
    #[prost(int64, tag = "3")]
    IntValue(i64),
    /// A float.
    #[prost(double, tag = "4")]
    DoubleValue(f64),
    /// A list of values.
    #[prost(message, tag = "5")]
    ArrayValue(ArrayValue),
    /// A map of values.
    #[prost(message, tag = "6")]
    KvlistValue(KeyValueList),
    /// Bytes.
    #[prost(bytes, tag = "7")]
    BytesValue(Vec<u8>),
    /// A string, as a string index (profiles only).
    #[prost(int32, tag = "8")]
    StringValueStrindex(i32),
}

/// The JSON key of each kind, camelCase then proto name.
const VALUE_KEYS: [(&str, &str); 8] = [
    ("stringValue", "string_value"),
    ("boolValue", "bool_value"),
    ("intValue", "int_value"),
    ("doubleValue", "double_value"),
    ("arrayValue", "array_value"),
    ("kvlistValue", "kvlist_value"),
    ("bytesValue", "bytes_value"),
    ("stringValueStrindex", "string_value_strindex"),
];

impl Serialize for AnyValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(usize::from(self.value.is_some())))?;
        match &self.value {
            None => {}
            Some(Value::StringValue(v)) => map.serialize_entry(VALUE_KEYS[0].0, v)?,
            Some(Value::BoolValue(v)) => map.serialize_entry(VALUE_KEYS[1].0, v)?,
            Some(Value::IntValue(v)) => map.serialize_entry(VALUE_KEYS[2].0, &v.to_string())?,
            Some(Value::DoubleValue(v)) => {
                map.serialize_entry(VALUE_KEYS[3].0, &Double(*v))?;
            }
            Some(Value::ArrayValue(v)) => map.serialize_entry(VALUE_KEYS[4].0, v)?,
            Some(Value::KvlistValue(v)) => map.serialize_entry(VALUE_KEYS[5].0, v)?,
            Some(Value::BytesValue(v)) => map.serialize_entry(VALUE_KEYS[6].0, &Base64(v))?,
            Some(Value::StringValueStrindex(v)) => map.serialize_entry(VALUE_KEYS[7].0, v)?,
        }
        map.end()
    }
}

/// A double written with [`protojson::as_double`].
struct Double(f64);

impl Serialize for Double {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        protojson::as_double(&self.0, s)
    }
}

/// Bytes written with [`protojson::base64`].
struct Base64<'a>(&'a [u8]);

impl Serialize for Base64<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        protojson::base64::serialize(self.0, s)
    }
}

impl<'de> Deserialize<'de> for AnyValue {
    /// An object with at most one of the eight keys (either spelling); unknown keys are
    /// ignored, `null` is no value.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct AnyValueVisitor;

        /// A double read with [`protojson::double`].
        struct ReadDouble(f64);
        impl<'de> Deserialize<'de> for ReadDouble {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                protojson::double(d).map(ReadDouble)
            }
        }
        /// An integer read with [`protojson::integer`].
        struct ReadInt<T>(T);
        impl<'de, T: protojson::Integer> Deserialize<'de> for ReadInt<T> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                protojson::integer(d).map(ReadInt)
            }
        }
        /// Bytes read with [`protojson::base64`].
        struct ReadBytes(Vec<u8>);
        impl<'de> Deserialize<'de> for ReadBytes {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                protojson::base64::deserialize(d).map(ReadBytes)
            }
        }

        impl<'de> Visitor<'de> for AnyValueVisitor {
            type Value = AnyValue;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an AnyValue object with at most one value")
            }

            fn visit_unit<E: de::Error>(self) -> Result<AnyValue, E> {
                Ok(AnyValue { value: None })
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AnyValue, A::Error> {
                let mut value = None;
                while let Some(key) = map.next_key::<String>()? {
                    let Some(kind) = VALUE_KEYS
                        .iter()
                        .position(|(camel, proto)| key == *camel || key == *proto)
                    else {
                        map.next_value::<de::IgnoredAny>()?;
                        continue;
                    };
                    let read = match kind {
                        0 => map.next_value::<Option<String>>()?.map(Value::StringValue),
                        1 => map.next_value::<Option<bool>>()?.map(Value::BoolValue),
                        2 => map
                            .next_value::<Option<ReadInt<i64>>>()?
                            .map(|v| Value::IntValue(v.0)),
                        3 => map
                            .next_value::<Option<ReadDouble>>()?
                            .map(|v| Value::DoubleValue(v.0)),
                        4 => map
                            .next_value::<Option<ArrayValue>>()?
                            .map(Value::ArrayValue),
                        5 => map
                            .next_value::<Option<KeyValueList>>()?
                            .map(Value::KvlistValue),
                        6 => map
                            .next_value::<Option<ReadBytes>>()?
                            .map(|v| Value::BytesValue(v.0)),
                        _ => map
                            .next_value::<Option<ReadInt<i32>>>()?
                            .map(|v| Value::StringValueStrindex(v.0)),
                    };
                    if read.is_some() {
                        if value.is_some() {
                            return Err(de::Error::custom("AnyValue has more than one value set"));
                        }
                        value = read;
                    }
                }
                Ok(AnyValue { value })
            }
        }

        d.deserialize_any(AnyValueVisitor)
    }
}

/// `common.v1.ArrayValue`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ArrayValue {
    /// The values.
    #[prost(message, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub values: Vec<AnyValue>,
}

/// `common.v1.KeyValueList`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KeyValueList {
    /// The pairs.
    #[prost(message, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub values: Vec<KeyValue>,
}

/// `common.v1.KeyValue`: an attribute of a resource or scope.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KeyValue {
    /// The key; empty when `key_strindex` is used.
    #[prost(string, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub key: String,
    /// The value.
    #[prost(message, optional, tag = "2")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<AnyValue>,
    /// The key as a string index (profiles only); 0 when `key` is used.
    #[prost(int32, tag = "3")]
    #[serde(alias = "key_strindex", deserialize_with = "protojson::integer")]
    pub key_strindex: i32,
}

/// `common.v1.InstrumentationScope`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct InstrumentationScope {
    /// The scope's name: the profiler.
    #[prost(string, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub name: String,
    /// Its version.
    #[prost(string, tag = "2")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub version: String,
    /// Its attributes.
    #[prost(message, repeated, tag = "3")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub attributes: Vec<KeyValue>,
    /// Attributes the sender dropped.
    #[prost(uint32, tag = "4")]
    #[serde(
        alias = "dropped_attributes_count",
        deserialize_with = "protojson::integer"
    )]
    pub dropped_attributes_count: u32,
}

/// `resource.v1.Resource`; its `entity_refs` (field 3) are not read.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Resource {
    /// Its attributes: `service.name`, `host.name`, ...
    #[prost(message, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub attributes: Vec<KeyValue>,
    /// Attributes the sender dropped.
    #[prost(uint32, tag = "2")]
    #[serde(
        alias = "dropped_attributes_count",
        deserialize_with = "protojson::integer"
    )]
    pub dropped_attributes_count: u32,
}

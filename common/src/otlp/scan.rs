//! A walk over the protobuf bytes of an export request before prost decodes them, against
//! the v1.10 schema: it allocates nothing, and it is what caps sizes before decoding and
//! rejects payloads of another schema release.
//!
//! It adds up what decoding would allocate (every message's struct, every packed element,
//! every string's bytes), counts samples and dictionary entries, and bounds nesting, so that
//! [`Limits`] apply before a byte is allocated. In the profiles messages (the `Development`
//! part of the schema) it checks every field number and wire type: a field the schema does not
//! have, a field of the wrong wire type, a single-valued field sent twice, or a repeated
//! number sent unpacked is what a sender of another release writes (`Sample.values` was field
//! 2 in v1.9, and its field 4 was then `link_index`, a plain varint; `Profile.sample_type` was
//! repeated until v1.7), and prost would read those silently as something else. The
//! `common.v1` and `resource.v1` messages are stable, and their unknown fields are skipped as
//! protobuf intends.

use std::mem::size_of;

use super::proto;
use super::{Limits, OtlpError};
use crate::varint;

/// The deepest nesting of messages accepted: the profiles messages need 5 levels; attribute
/// values (lists of lists) get the rest.
pub(super) const MAX_DEPTH: usize = 32;

/// What a field holds, as the walk needs to know it.
#[derive(Clone, Copy)]
enum Kind {
    /// A message (length-delimited).
    Message(&'static Schema),
    /// A string or bytes (length-delimited).
    Bytes,
    /// An integer or bool (varint).
    Varint,
    /// A `fixed64` or `double` (8 bytes).
    Fixed64,
    /// Packed varints decoding to elements of this size (length-delimited).
    PackedVarint(usize),
    /// Packed `fixed64`s (length-delimited).
    PackedFixed64,
}

impl Kind {
    fn wire_type(self) -> u8 {
        match self {
            Kind::Varint => 0,
            Kind::Fixed64 => 1,
            _ => 2,
        }
    }
}

/// What a message adds to the counts that [`Limits`] bound.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Counts {
    Nothing,
    Sample,
}

/// A message of the schema.
struct Schema {
    name: &'static str,
    /// What one decoded instance takes, before its strings and lists.
    size: usize,
    /// Whether fields outside `fields`, wire-type mismatches and repeats of singular fields are
    /// errors (the profiles messages) or skipped (the stable ones).
    strict: bool,
    counts: Counts,
    /// `(number, kind, repeated)`.
    fields: &'static [(u32, Kind, bool)],
}

impl Schema {
    fn field(&self, number: u32) -> Option<(Kind, bool)> {
        self.fields
            .iter()
            .find(|(n, _, _)| *n == number)
            .map(|&(_, kind, repeated)| (kind, repeated))
    }
}

const I32: Kind = Kind::PackedVarint(size_of::<i32>());
const I64: Kind = Kind::PackedVarint(size_of::<i64>());

static REQUEST: Schema = Schema {
    name: "ExportProfilesServiceRequest",
    size: size_of::<proto::ExportProfilesServiceRequest>(),
    strict: true,
    counts: Counts::Nothing,
    fields: &[
        (1, Kind::Message(&RESOURCE_PROFILES), true),
        (2, Kind::Message(&DICTIONARY), false),
    ],
};

/// Dictionary entries are counted by the field they sit in, see [`DICTIONARY_TABLES`].
static DICTIONARY: Schema = Schema {
    name: "ProfilesDictionary",
    size: size_of::<proto::ProfilesDictionary>(),
    strict: true,
    counts: Counts::Nothing,
    fields: &[
        (1, Kind::Message(&MAPPING), true),
        (2, Kind::Message(&LOCATION), true),
        (3, Kind::Message(&FUNCTION), true),
        (4, Kind::Message(&LINK), true),
        (5, Kind::Bytes, true),
        (6, Kind::Message(&KEY_VALUE_AND_UNIT), true),
        (7, Kind::Message(&STACK), true),
    ],
};

static RESOURCE_PROFILES: Schema = Schema {
    name: "ResourceProfiles",
    size: size_of::<proto::ResourceProfiles>(),
    strict: true,
    counts: Counts::Nothing,
    fields: &[
        (1, Kind::Message(&RESOURCE), false),
        (2, Kind::Message(&SCOPE_PROFILES), true),
        (3, Kind::Bytes, false),
    ],
};

static SCOPE_PROFILES: Schema = Schema {
    name: "ScopeProfiles",
    size: size_of::<proto::ScopeProfiles>(),
    strict: true,
    counts: Counts::Nothing,
    fields: &[
        (1, Kind::Message(&SCOPE), false),
        (2, Kind::Message(&PROFILE), true),
        (3, Kind::Bytes, false),
    ],
};

static PROFILE: Schema = Schema {
    name: "Profile",
    size: size_of::<proto::Profile>(),
    strict: true,
    counts: Counts::Nothing,
    fields: &[
        (1, Kind::Message(&VALUE_TYPE), false),
        (2, Kind::Message(&SAMPLE), true),
        (3, Kind::Fixed64, false),
        (4, Kind::Varint, false),
        (5, Kind::Message(&VALUE_TYPE), false),
        (6, Kind::Varint, false),
        (7, Kind::Bytes, false),
        (8, Kind::Varint, false),
        (9, Kind::Bytes, false),
        (10, Kind::Bytes, false),
        (11, I32, true),
    ],
};

static LINK: Schema = Schema {
    name: "Link",
    size: size_of::<proto::Link>(),
    strict: true,
    counts: Counts::Nothing,
    fields: &[(1, Kind::Bytes, false), (2, Kind::Bytes, false)],
};

static VALUE_TYPE: Schema = Schema {
    name: "ValueType",
    size: size_of::<proto::ValueType>(),
    strict: true,
    counts: Counts::Nothing,
    fields: &[(1, Kind::Varint, false), (2, Kind::Varint, false)],
};

static SAMPLE: Schema = Schema {
    name: "Sample",
    size: size_of::<proto::Sample>(),
    strict: true,
    counts: Counts::Sample,
    fields: &[
        (1, Kind::Varint, false),
        (2, I32, true),
        (3, Kind::Varint, false),
        (4, I64, true),
        (5, Kind::PackedFixed64, true),
    ],
};

static MAPPING: Schema = Schema {
    name: "Mapping",
    size: size_of::<proto::Mapping>(),
    strict: true,
    counts: Counts::Nothing,
    fields: &[
        (1, Kind::Varint, false),
        (2, Kind::Varint, false),
        (3, Kind::Varint, false),
        (4, Kind::Varint, false),
        (5, I32, true),
    ],
};

static STACK: Schema = Schema {
    name: "Stack",
    size: size_of::<proto::Stack>(),
    strict: true,
    counts: Counts::Nothing,
    fields: &[(1, I32, true)],
};

static LOCATION: Schema = Schema {
    name: "Location",
    size: size_of::<proto::Location>(),
    strict: true,
    counts: Counts::Nothing,
    fields: &[
        (1, Kind::Varint, false),
        (2, Kind::Varint, false),
        (3, Kind::Message(&LINE), true),
        (4, I32, true),
    ],
};

static LINE: Schema = Schema {
    name: "Line",
    size: size_of::<proto::Line>(),
    strict: true,
    counts: Counts::Nothing,
    fields: &[
        (1, Kind::Varint, false),
        (2, Kind::Varint, false),
        (3, Kind::Varint, false),
    ],
};

static FUNCTION: Schema = Schema {
    name: "Function",
    size: size_of::<proto::Function>(),
    strict: true,
    counts: Counts::Nothing,
    fields: &[
        (1, Kind::Varint, false),
        (2, Kind::Varint, false),
        (3, Kind::Varint, false),
        (4, Kind::Varint, false),
    ],
};

static KEY_VALUE_AND_UNIT: Schema = Schema {
    name: "KeyValueAndUnit",
    size: size_of::<proto::KeyValueAndUnit>(),
    strict: true,
    counts: Counts::Nothing,
    fields: &[
        (1, Kind::Varint, false),
        (2, Kind::Message(&ANY_VALUE), false),
        (3, Kind::Varint, false),
    ],
};

static ANY_VALUE: Schema = Schema {
    name: "AnyValue",
    size: size_of::<proto::AnyValue>(),
    strict: false,
    counts: Counts::Nothing,
    fields: &[
        (1, Kind::Bytes, false),
        (2, Kind::Varint, false),
        (3, Kind::Varint, false),
        (4, Kind::Fixed64, false),
        (5, Kind::Message(&ARRAY_VALUE), false),
        (6, Kind::Message(&KEY_VALUE_LIST), false),
        (7, Kind::Bytes, false),
        (8, Kind::Varint, false),
    ],
};

static ARRAY_VALUE: Schema = Schema {
    name: "ArrayValue",
    size: size_of::<proto::ArrayValue>(),
    strict: false,
    counts: Counts::Nothing,
    fields: &[(1, Kind::Message(&ANY_VALUE), true)],
};

static KEY_VALUE_LIST: Schema = Schema {
    name: "KeyValueList",
    size: size_of::<proto::KeyValueList>(),
    strict: false,
    counts: Counts::Nothing,
    fields: &[(1, Kind::Message(&KEY_VALUE), true)],
};

static KEY_VALUE: Schema = Schema {
    name: "KeyValue",
    size: size_of::<proto::KeyValue>(),
    strict: false,
    counts: Counts::Nothing,
    fields: &[
        (1, Kind::Bytes, false),
        (2, Kind::Message(&ANY_VALUE), false),
        (3, Kind::Varint, false),
    ],
};

static SCOPE: Schema = Schema {
    name: "InstrumentationScope",
    size: size_of::<proto::InstrumentationScope>(),
    strict: false,
    counts: Counts::Nothing,
    fields: &[
        (1, Kind::Bytes, false),
        (2, Kind::Bytes, false),
        (3, Kind::Message(&KEY_VALUE), true),
        (4, Kind::Varint, false),
    ],
};

static RESOURCE: Schema = Schema {
    name: "Resource",
    size: size_of::<proto::Resource>(),
    strict: false,
    counts: Counts::Nothing,
    fields: &[
        (1, Kind::Message(&KEY_VALUE), true),
        (2, Kind::Varint, false),
    ],
};

/// What the walk found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Scan {
    /// Samples in every profile.
    pub(super) samples: usize,
    /// Entries of every dictionary table.
    pub(super) entries: usize,
    /// What decoding will allocate, in bytes, before allocator and vector-growth slack.
    pub(super) decoded_bytes: usize,
}

/// A message being walked.
struct Open {
    schema: &'static Schema,
    /// Where its bytes end.
    end: usize,
    /// The singular fields seen so far, as a bit per field number (all are below 64).
    seen: u64,
}

/// Walks `bytes` as an export request; see the [module documentation](self).
///
/// # Errors
///
/// [`OtlpError::Malformed`] for bytes that are not protobuf, [`OtlpError::UnknownField`],
/// [`OtlpError::WireType`], [`OtlpError::RepeatedField`] for another schema,
/// [`OtlpError::TooDeep`], and [`OtlpError::TooManySamples`], [`OtlpError::TooManyEntries`]
/// or [`OtlpError::TooExpensive`] past `limits`.
pub(super) fn scan(bytes: &[u8], limits: &Limits) -> Result<Scan, OtlpError> {
    let budget = limits.max_bytes.saturating_mul(super::DECODED_PER_BYTE);
    let malformed = |offset: usize, reason: &'static str| OtlpError::Malformed { offset, reason };
    let mut out = Scan {
        decoded_bytes: REQUEST.size,
        ..Scan::default()
    };
    let mut open = vec![Open {
        schema: &REQUEST,
        end: bytes.len(),
        seen: 0,
    }];
    let mut pos = 0usize;
    loop {
        while open.last().is_some_and(|m| m.end == pos) {
            open.pop();
        }
        let Some(current) = open.last_mut() else {
            break;
        };
        let schema = current.schema;
        let end = current.end;
        let key_at = pos;
        let (key, n) =
            varint::get(&bytes[pos..end]).ok_or(malformed(pos, "truncated field key"))?;
        pos += n;
        let number = u32::try_from(key >> 3).map_err(|_| malformed(key_at, "field number"))?;
        let wire_type = (key & 7) as u8;
        if number == 0 {
            return Err(malformed(key_at, "field number 0"));
        }
        let declared = schema.field(number);
        if schema.strict {
            let Some((kind, repeated)) = declared else {
                return Err(OtlpError::UnknownField {
                    message: schema.name,
                    field: number,
                });
            };
            if wire_type != kind.wire_type() {
                return Err(OtlpError::WireType {
                    message: schema.name,
                    field: number,
                    found: wire_type_name(wire_type),
                    expected: wire_type_name(kind.wire_type()),
                });
            }
            if !repeated {
                let bit = 1u64 << number;
                if current.seen & bit != 0 {
                    return Err(OtlpError::RepeatedField {
                        message: schema.name,
                        field: number,
                    });
                }
                current.seen |= bit;
            }
        }
        let kind = match declared {
            Some((kind, _)) if wire_type == kind.wire_type() => Some(kind),
            _ => None,
        };
        match wire_type {
            0 => {
                let (_, n) =
                    varint::get(&bytes[pos..end]).ok_or(malformed(pos, "truncated varint"))?;
                pos += n;
            }
            1 => {
                if end - pos < 8 {
                    return Err(malformed(pos, "truncated fixed64"));
                }
                pos += 8;
            }
            5 => {
                if end - pos < 4 {
                    return Err(malformed(pos, "truncated fixed32"));
                }
                pos += 4;
            }
            2 => {
                let (len, n) =
                    varint::get(&bytes[pos..end]).ok_or(malformed(pos, "truncated length"))?;
                pos += n;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&len| len <= end - pos)
                    .ok_or(malformed(pos, "length past the end of its message"))?;
                let payload = &bytes[pos..pos + len];
                match kind {
                    Some(Kind::Message(child)) => {
                        if open.len() >= MAX_DEPTH {
                            return Err(OtlpError::TooDeep { limit: MAX_DEPTH });
                        }
                        out.decoded_bytes = out.decoded_bytes.saturating_add(child.size);
                        if child.counts == Counts::Sample {
                            out.samples += 1;
                        }
                        if std::ptr::eq(schema, &DICTIONARY) {
                            out.entries += 1;
                        }
                        // The child's fields are walked next, from `pos`.
                        open.push(Open {
                            schema: child,
                            end: pos + len,
                            seen: 0,
                        });
                        check(&out, budget, limits)?;
                        continue;
                    }
                    Some(Kind::PackedVarint(size)) => {
                        if payload.last().is_some_and(|&b| b & 0x80 != 0) {
                            return Err(malformed(pos + len, "truncated packed varint"));
                        }
                        let count = payload.iter().filter(|&&b| b & 0x80 == 0).count();
                        out.decoded_bytes =
                            out.decoded_bytes.saturating_add(count.saturating_mul(size));
                    }
                    Some(Kind::PackedFixed64) => {
                        if !len.is_multiple_of(8) {
                            return Err(malformed(
                                pos,
                                "packed fixed64 of a length not a multiple of 8",
                            ));
                        }
                        out.decoded_bytes = out.decoded_bytes.saturating_add(len);
                    }
                    Some(Kind::Bytes) => {
                        if std::ptr::eq(schema, &DICTIONARY) {
                            out.entries += 1;
                        }
                        out.decoded_bytes =
                            out.decoded_bytes.saturating_add(len + size_of::<String>());
                    }
                    // Skipped: an unknown field of a stable message.
                    Some(Kind::Varint | Kind::Fixed64) | None => {}
                }
                pos += len;
            }
            _ => return Err(malformed(key_at, "group or invalid wire type")),
        }
        check(&out, budget, limits)?;
    }
    Ok(out)
}

/// Fails as soon as a count passes its limit.
fn check(scan: &Scan, budget: usize, limits: &Limits) -> Result<(), OtlpError> {
    if scan.samples > limits.max_samples {
        return Err(OtlpError::TooManySamples {
            limit: limits.max_samples,
        });
    }
    if scan.entries > limits.max_entries {
        return Err(OtlpError::TooManyEntries {
            limit: limits.max_entries,
        });
    }
    if scan.decoded_bytes > budget {
        return Err(OtlpError::TooExpensive { limit: budget });
    }
    Ok(())
}

fn wire_type_name(wire_type: u8) -> &'static str {
    match wire_type {
        0 => "varint",
        1 => "fixed64",
        2 => "length-delimited",
        5 => "fixed32",
        _ => "group",
    }
}

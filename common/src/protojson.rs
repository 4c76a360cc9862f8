//! The proto3 JSON mapping for messages written by hand for prost, as serde field helpers.
//!
//! Input: JSON bodies of Connect's JSON codec (`querier.v1`, `settings.v1`) and of OTLP/HTTP
//! JSON. Output: the same prost structs the binary codec fills. Callers: the message modules
//! ([`querier`](crate::querier), [`otlp`](crate::otlp), [`pprof::proto`](crate::pprof::proto)),
//! which derive serde with `#[serde(default, rename_all = "camelCase")]` and name these helpers
//! per field.
//!
//! What the mapping asks for, and how each part is met:
//!
//! - Field names: lowerCamelCase on output (`rename_all`); on input the proto name as well,
//!   through a serde `alias` on every field whose two spellings differ.
//! - 64-bit integers travel as decimal strings ([`as_string`]); on input every integer field
//!   takes a JSON number or a decimal string ([`integer`], [`integers`]).
//! - Enums are written by name; on input a name or a number ([`enumeration`]). A name this
//!   build does not know reads as the enum's zero value, as Connect's codec (protojson with
//!   `DiscardUnknown`) reads it.
//! - `bytes` are base64 ([`base64`]); on input the standard or the URL-safe alphabet, padded or
//!   not. OTLP's trace and span ids are hex instead ([`otlp_id`]).
//! - `double`: a number, or `"NaN"`, `"Infinity"`, `"-Infinity"` ([`double`], [`as_double`]).
//! - `null` is the field's default value ([`nullable`] and every helper above); unknown fields
//!   are ignored, as both Connect and OTLP require.
//!
//! Output writes every field, default values included (protojson's `EmitUnpopulated`), except
//! unset `optional` fields and unset messages: readers that index the JSON directly, as the
//! Profiles Drilldown app does, then always find the lists they expect.

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use ::base64::Engine;
use ::base64::engine::general_purpose::{
    STANDARD, STANDARD_PAD_INDIFFERENT, URL_SAFE_PAD_INDIFFERENT,
};
use serde::Deserialize;
use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::ser::{SerializeSeq, Serializer};

/// A protobuf enum: every value with the name the `.proto` file gives it.
pub trait ProtoEnum {
    /// `(name, number)` for every value.
    const VALUES: &'static [(&'static str, i32)];

    /// The name of `number`, if it is a known value.
    fn name(number: i32) -> Option<&'static str> {
        Self::VALUES
            .iter()
            .find(|(_, n)| *n == number)
            .map(|(name, _)| *name)
    }

    /// The number named `name`, if it is a known value.
    fn number(name: &str) -> Option<i32> {
        Self::VALUES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, number)| *number)
    }
}

/// The integer types of protobuf scalars.
pub trait Integer: Copy + Default + FromStr + TryFrom<i64> + TryFrom<u64> + fmt::Display {}

impl Integer for i32 {}
impl Integer for u32 {}
impl Integer for i64 {}
impl Integer for u64 {}

/// Reads one integer: a JSON number (an integral float too, as `1e3`), a decimal string, or
/// `null` for zero.
struct IntegerVisitor<T>(PhantomData<T>);

impl<T: Integer> IntegerVisitor<T> {
    fn out_of_range<E: de::Error>(&self, unexpected: Unexpected<'_>) -> E {
        E::invalid_value(unexpected, self)
    }
}

impl<'de, T: Integer> Visitor<'de> for IntegerVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "an integer in the range of {} (a JSON number or a decimal string)",
            std::any::type_name::<T>()
        )
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        T::try_from(v).map_err(|_| self.out_of_range(Unexpected::Signed(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        T::try_from(v).map_err(|_| self.out_of_range(Unexpected::Unsigned(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        // 2^63 and 2^64 are exact in f64; anything integral below them converts exactly.
        const TWO_63: f64 = 9_223_372_036_854_775_808.0;
        if v.fract() != 0.0 || !v.is_finite() {
            return Err(self.out_of_range(Unexpected::Float(v)));
        }
        if (-TWO_63..0.0).contains(&v) {
            self.visit_i64(v as i64)
        } else if (0.0..2.0 * TWO_63).contains(&v) {
            self.visit_u64(v as u64)
        } else {
            Err(self.out_of_range(Unexpected::Float(v)))
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        v.parse().map_err(|_| self.out_of_range(Unexpected::Str(v)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<T, E> {
        Ok(T::default())
    }

    fn visit_none<E: de::Error>(self) -> Result<T, E> {
        Ok(T::default())
    }
}

/// One integer as an element of a list.
struct Element<T>(T);

impl<'de, T: Integer> Deserialize<'de> for Element<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(IntegerVisitor(PhantomData)).map(Element)
    }
}

/// Reads an integer field: a number, a decimal string, or `null` for zero.
///
/// # Errors
///
/// When the value is of another JSON type or outside the field's range.
pub fn integer<'de, D: Deserializer<'de>, T: Integer>(d: D) -> Result<T, D::Error> {
    d.deserialize_any(IntegerVisitor(PhantomData))
}

/// Reads a proto3 `optional` integer field: `null` is unset.
///
/// # Errors
///
/// As [`integer`].
pub fn optional_integer<'de, D: Deserializer<'de>, T: Integer>(
    d: D,
) -> Result<Option<T>, D::Error> {
    Option::<Element<T>>::deserialize(d).map(|v| v.map(|e| e.0))
}

/// Reads a repeated integer field: a list of numbers or decimal strings; `null` is empty.
///
/// # Errors
///
/// As [`integer`], for any element.
pub fn integers<'de, D: Deserializer<'de>, T: Integer>(d: D) -> Result<Vec<T>, D::Error> {
    Option::<Vec<Element<T>>>::deserialize(d)
        .map(|v| v.unwrap_or_default().into_iter().map(|e| e.0).collect())
}

/// Writes a 64-bit integer as a decimal string.
///
/// # Errors
///
/// Only the serializer's own.
pub fn as_string<S: Serializer, T: fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// Writes a proto3 `optional` 64-bit integer as a decimal string (unset fields are skipped
/// with `skip_serializing_if = "Option::is_none"`; an unset one here writes `null`).
///
/// # Errors
///
/// Only the serializer's own.
pub fn optional_as_string<S: Serializer, T: fmt::Display>(
    v: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

/// Writes a repeated 64-bit integer field as a list of decimal strings.
///
/// # Errors
///
/// Only the serializer's own.
pub fn as_strings<S: Serializer, T: fmt::Display>(v: &[T], s: S) -> Result<S::Ok, S::Error> {
    let mut seq = s.serialize_seq(Some(v.len()))?;
    for item in v {
        seq.serialize_element(&format_args!("{item}"))?;
    }
    seq.end()
}

/// Reads any field whose JSON form is serde's own (strings, bools, messages, lists of those),
/// with `null` as the default value.
///
/// # Errors
///
/// The field type's own.
pub fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(
    d: D,
) -> Result<T, D::Error> {
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

/// Reads a `double`: a number, a numeric string, `"NaN"`, `"Infinity"` or `"-Infinity"`;
/// `null` is zero.
///
/// # Errors
///
/// When the value is of another JSON type or a string that is none of those.
pub fn double<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    struct DoubleVisitor;

    impl<'de> Visitor<'de> for DoubleVisitor {
        type Value = f64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a number, a numeric string, \"NaN\", \"Infinity\" or \"-Infinity\"")
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
            Ok(v)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
            Ok(v as f64)
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
            Ok(v as f64)
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
            match v {
                "NaN" => Ok(f64::NAN),
                "Infinity" => Ok(f64::INFINITY),
                "-Infinity" => Ok(f64::NEG_INFINITY),
                // Rust also reads "inf" and "nan"; the mapping does not.
                _ if v
                    .bytes()
                    .any(|b| b.is_ascii_alphabetic() && !matches!(b, b'e' | b'E')) =>
                {
                    Err(E::invalid_value(Unexpected::Str(v), &self))
                }
                _ => v
                    .parse()
                    .map_err(|_| E::invalid_value(Unexpected::Str(v), &self)),
            }
        }

        fn visit_unit<E: de::Error>(self) -> Result<f64, E> {
            Ok(0.0)
        }

        fn visit_none<E: de::Error>(self) -> Result<f64, E> {
            Ok(0.0)
        }
    }

    d.deserialize_any(DoubleVisitor)
}

/// Writes a `double`: a number when finite, else `"NaN"`, `"Infinity"` or `"-Infinity"`.
///
/// # Errors
///
/// Only the serializer's own.
pub fn as_double<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.is_nan() {
        s.serialize_str("NaN")
    } else if v.is_infinite() {
        s.serialize_str(if *v > 0.0 { "Infinity" } else { "-Infinity" })
    } else {
        s.serialize_f64(*v)
    }
}

/// Reads an enum field stored as `i32`: a value's name, or any number (proto3 enums are
/// open). A name this build does not know reads as 0, as Connect's codec reads it; `null` is 0.
///
/// # Errors
///
/// When the value is neither a string nor an `i32`.
pub fn enumeration<'de, E: ProtoEnum, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    d.deserialize_any(EnumVisitor::<E>(PhantomData))
}

/// Reads a proto3 `optional` enum field: `null` is unset; otherwise as [`enumeration`].
///
/// # Errors
///
/// As [`enumeration`].
pub fn optional_enumeration<'de, E: ProtoEnum, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<i32>, D::Error> {
    struct Wrapped<E>(i32, PhantomData<E>);

    impl<'de, E: ProtoEnum> Deserialize<'de> for Wrapped<E> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            enumeration::<E, D>(d).map(|v| Wrapped(v, PhantomData))
        }
    }

    Option::<Wrapped<E>>::deserialize(d).map(|v| v.map(|w| w.0))
}

struct EnumVisitor<E>(PhantomData<E>);

impl<'de, E: ProtoEnum> Visitor<'de> for EnumVisitor<E> {
    type Value = i32;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an enum value's name or number")
    }

    fn visit_str<Er: de::Error>(self, v: &str) -> Result<i32, Er> {
        Ok(E::number(v).unwrap_or(0))
    }

    fn visit_i64<Er: de::Error>(self, v: i64) -> Result<i32, Er> {
        i32::try_from(v).map_err(|_| Er::invalid_value(Unexpected::Signed(v), &self))
    }

    fn visit_u64<Er: de::Error>(self, v: u64) -> Result<i32, Er> {
        i32::try_from(v).map_err(|_| Er::invalid_value(Unexpected::Unsigned(v), &self))
    }

    fn visit_unit<Er: de::Error>(self) -> Result<i32, Er> {
        Ok(0)
    }

    fn visit_none<Er: de::Error>(self) -> Result<i32, Er> {
        Ok(0)
    }
}

/// Writes an enum field by name, or by number when it is not a known value.
///
/// # Errors
///
/// Only the serializer's own.
pub fn enum_name<E: ProtoEnum, S: Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
    match E::name(*v) {
        Some(name) => s.serialize_str(name),
        None => s.serialize_i32(*v),
    }
}

/// Writes a proto3 `optional` enum field by name (see [`enum_name`]); unset writes `null`.
///
/// # Errors
///
/// Only the serializer's own.
pub fn optional_enum_name<E: ProtoEnum, S: Serializer>(
    v: &Option<i32>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => enum_name::<E, S>(v, s),
        None => s.serialize_none(),
    }
}

/// `bytes` fields: base64, standard alphabet and padding on output; on input either alphabet,
/// padded or not; `null` is empty.
pub mod base64 {
    use super::*;

    /// Writes standard base64 with padding.
    ///
    /// # Errors
    ///
    /// Only the serializer's own.
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(v))
    }

    /// Reads base64 in either alphabet, padded or not.
    ///
    /// # Errors
    ///
    /// When the value is not a string of base64.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        let text = text.unwrap_or_default();
        decode(&text).map_err(|()| de::Error::invalid_value(Unexpected::Str(&text), &"base64"))
    }

    pub(crate) fn decode(text: &str) -> Result<Vec<u8>, ()> {
        STANDARD_PAD_INDIFFERENT
            .decode(text)
            .or_else(|_| URL_SAFE_PAD_INDIFFERENT.decode(text))
            .map_err(|_| ())
    }
}

/// OTLP's trace, span and profile ids: hex (case-insensitive) on output and input, as OTLP's
/// JSON encoding prescribes; base64 is accepted too, because protojson-based senders write
/// it. The two cannot be confused: an id of `n` bytes is `2n` hex digits, and `2n` base64
/// characters would hold `1.5n` bytes.
pub mod otlp_id {
    use super::*;

    /// Writes lowercase hex.
    ///
    /// # Errors
    ///
    /// Only the serializer's own.
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::span::hex(v))
    }

    /// Reads hex, or base64 when the text is not an even run of hex digits.
    ///
    /// # Errors
    ///
    /// When the value is neither.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        let text = text.unwrap_or_default();
        crate::span::unhex(&text)
            .or_else(|| base64::decode(&text).ok())
            .ok_or_else(|| de::Error::invalid_value(Unexpected::Str(&text), &"hex or base64"))
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    enum Color {}

    impl ProtoEnum for Color {
        const VALUES: &'static [(&'static str, i32)] = &[("COLOR_RED", 0), ("COLOR_BLUE", 1)];
    }

    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(default, rename_all = "camelCase")]
    struct Message {
        #[serde(
            serialize_with = "as_string",
            deserialize_with = "integer",
            alias = "big_number"
        )]
        big_number: i64,
        #[serde(deserialize_with = "integer")]
        small: u32,
        #[serde(serialize_with = "as_strings", deserialize_with = "integers")]
        list: Vec<u64>,
        #[serde(
            skip_serializing_if = "Option::is_none",
            serialize_with = "optional_as_string",
            deserialize_with = "optional_integer"
        )]
        maybe: Option<i64>,
        #[serde(serialize_with = "as_double", deserialize_with = "double")]
        ratio: f64,
        #[serde(
            serialize_with = "enum_name::<Color, _>",
            deserialize_with = "enumeration::<Color, _>"
        )]
        color: i32,
        #[serde(with = "base64")]
        raw: Vec<u8>,
        #[serde(deserialize_with = "nullable")]
        name: String,
    }

    #[test]
    fn writes_the_mapping() {
        let m = Message {
            big_number: -5,
            small: 7,
            list: vec![1, u64::MAX],
            maybe: Some(3),
            ratio: f64::INFINITY,
            color: 1,
            raw: vec![0xfb, 0xff],
            name: "x".into(),
        };
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"bigNumber":"-5","small":7,"list":["1","18446744073709551615"],"maybe":"3","ratio":"Infinity","color":"COLOR_BLUE","raw":"+/8=","name":"x"}"#
        );
        let back: Message = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn reads_every_accepted_spelling() {
        let m: Message = serde_json::from_str(
            r#"{"big_number": 12, "small": "7", "list": [1, "2", 3e0], "maybe": null,
                "ratio": "1.5", "color": 1, "raw": "-_8", "name": null, "unknown": [1]}"#,
        )
        .unwrap();
        assert_eq!(
            m,
            Message {
                big_number: 12,
                small: 7,
                list: vec![1, 2, 3],
                maybe: None,
                ratio: 1.5,
                color: 1,
                raw: vec![0xfb, 0xff],
                name: String::new(),
            }
        );
        let m: Message =
            serde_json::from_str(r#"{"color": "COLOR_GREEN", "ratio": "NaN"}"#).unwrap();
        assert_eq!(m.color, 0, "unknown names read as zero");
        assert!(m.ratio.is_nan());
    }

    #[test]
    fn rejects_what_does_not_fit() {
        for bad in [
            r#"{"small": -1}"#,
            r#"{"small": 4294967296}"#,
            r#"{"small": 1.5}"#,
            r#"{"bigNumber": "12 "}"#,
            r#"{"bigNumber": "9223372036854775808"}"#,
            r#"{"bigNumber": true}"#,
            r#"{"list": [1, "x"]}"#,
            r#"{"ratio": "inf"}"#,
            r#"{"color": 2147483648}"#,
            r#"{"raw": "!!"}"#,
            r#"{"bigNumber": 1, "big_number": 2}"#,
        ] {
            assert!(serde_json::from_str::<Message>(bad).is_err(), "{bad}");
        }
    }
}

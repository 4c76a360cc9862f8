//! Values of any class described by the metadata: primitives, strings, constant-pool keys,
//! arrays and nested objects, decoded as far as the caller asks and skipped beyond that.

use super::JfrError;
use super::metadata::Types;
use super::reader::{JfrString, Reader};

/// How deeply values may nest. Real classes nest three levels (a stack trace's frames); a
/// class that contains itself inline would otherwise recurse without reading a byte.
const MAX_VALUE_DEPTH: usize = 32;

/// The most elements an array that is kept may hold. Kept values take tens of bytes of memory
/// per input byte, so one huge array (a stack trace spanning the input) is refused rather than
/// materialized; real stack traces hold at most a few thousand frames.
const MAX_KEPT_ARRAY: usize = 1 << 16;

/// A decoded value. What the caller did not ask to keep is [`Value::Skipped`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    /// Not kept (or a float, which nothing here reads).
    Skipped,
    /// An integer, boolean or char, as its two's-complement bits.
    Int(u64),
    /// A string.
    Str(JfrString),
    /// A key into the constant pool of the field's type.
    Ref(u64),
    /// An array's elements.
    Array(Vec<Value>),
    /// An object's fields, in the order of its class's fields.
    Object(Vec<Value>),
}

impl Value {
    /// The integer, key or pooled-string key this value holds.
    pub(crate) fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(v) | Value::Ref(v) | Value::Str(JfrString::Pooled(v)) => Some(*v),
            _ => None,
        }
    }
}

/// The decoder's state for one recording: the work left, so that no input, however its classes
/// are arranged, makes parsing take more than a fixed multiple of its size.
pub(crate) struct Decoder<'t> {
    /// The chunk's classes.
    pub(crate) types: &'t Types,
    /// Values that may still be decoded in this recording.
    pub(crate) budget: &'t mut u64,
    /// The limit `budget` started from, for the error.
    pub(crate) limit: u64,
}

impl Decoder<'_> {
    /// Decodes one value of type `type_id`. Arrays, objects and strings are materialized down
    /// to `keep` levels (0 keeps only integers and keys); deeper ones are read and dropped.
    pub(crate) fn value(
        &mut self,
        r: &mut Reader<'_>,
        type_id: u64,
        keep: usize,
        depth: usize,
    ) -> Result<Value, JfrError> {
        if depth > MAX_VALUE_DEPTH {
            return Err(JfrError::TooDeep {
                offset: r.offset(),
                limit: MAX_VALUE_DEPTH,
            });
        }
        if *self.budget == 0 {
            return Err(JfrError::TooMuchWork {
                offset: r.offset(),
                limit: self.limit,
            });
        }
        *self.budget -= 1;
        let offset = r.offset();
        let class = self
            .types
            .classes
            .get(&type_id)
            .ok_or(JfrError::UnknownType { offset, type_id })?;
        match self.types.name(class.name) {
            "boolean" | "byte" => Ok(Value::Int(u64::from(r.u8()?))),
            "char" | "short" => Ok(Value::Int(r.int(2)?)),
            "int" => Ok(Value::Int(r.int(4)?)),
            "long" => Ok(Value::Int(r.int(8)?)),
            // Floats are written as raw IEEE bits, never compressed.
            "float" => r.bytes(4).map(|_| Value::Skipped),
            "double" => r.bytes(8).map(|_| Value::Skipped),
            "java.lang.String" => Ok(Value::Str(r.string(keep > 0)?)),
            _ => {
                let mut fields = Vec::new();
                for field in &class.fields {
                    let v = self.field(r, field.type_id, field.pooled, field.array, keep, depth)?;
                    if keep > 0 {
                        fields.push(v);
                    }
                }
                Ok(if keep > 0 {
                    Value::Object(fields)
                } else {
                    Value::Skipped
                })
            }
        }
    }

    /// Decodes a field's value: a key when pooled, else inline; an array of those when
    /// `array`.
    fn field(
        &mut self,
        r: &mut Reader<'_>,
        type_id: u64,
        pooled: bool,
        array: bool,
        keep: usize,
        depth: usize,
    ) -> Result<Value, JfrError> {
        let one = |d: &mut Self, r: &mut Reader<'_>, keep: usize| {
            if pooled {
                Ok(Value::Ref(r.long()?))
            } else {
                d.value(r, type_id, keep, depth + 1)
            }
        };
        if !array {
            return one(self, r, keep.saturating_sub(1));
        }
        // Elements of a class without fields take no bytes; the budget bounds those.
        let offset = r.offset();
        let count = r.bounded_count("array length")?;
        if keep > 1 && count > MAX_KEPT_ARRAY {
            return Err(JfrError::Invalid {
                what: "array length (kept arrays hold at most 65536 elements)",
                offset,
                value: count as u64,
            });
        }
        let mut items = Vec::new();
        for _ in 0..count {
            let v = one(self, r, keep.saturating_sub(2))?;
            if keep > 1 {
                items.push(v);
            }
        }
        Ok(if keep > 1 {
            Value::Array(items)
        } else {
            Value::Skipped
        })
    }
}

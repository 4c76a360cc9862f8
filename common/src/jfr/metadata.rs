//! The metadata event: the string table and element tree that describe every class (event
//! types, constant-pool types, primitives) of a chunk, read into a [`Types`] table.

use std::collections::HashMap;

use super::JfrError;
use super::reader::{JfrString, Reader};

/// How deep the element tree may nest. Real metadata is four levels deep (root, metadata,
/// class, field, annotation); the cap only stops hostile input from recursing without end.
const MAX_ELEMENT_DEPTH: usize = 16;

/// The most elements the tree may hold. Real metadata has a few thousand; each element takes
/// far more memory than its three-byte minimum encoding, so the count is capped on its own.
const MAX_ELEMENTS: usize = 1 << 20;

/// One field of a class.
#[derive(Clone, Debug)]
pub(crate) struct Field {
    /// The field's name (`stackTrace`, `tlabSize`, ...), an index into [`Types::strings`].
    pub(crate) name: usize,
    /// The id of its type.
    pub(crate) type_id: u64,
    /// Whether the value is a key into its type's constant pool rather than inline.
    pub(crate) pooled: bool,
    /// Whether the value is an array (`dimension="1"`).
    pub(crate) array: bool,
}

/// One class: primitive, event type or constant-pool type.
#[derive(Clone, Debug)]
pub(crate) struct Class {
    /// The fully qualified name (`jdk.ExecutionSample`, `int`, `java.lang.String`), an index
    /// into [`Types::strings`].
    pub(crate) name: usize,
    /// Its fields, in encoding order.
    pub(crate) fields: Vec<Field>,
}

/// The classes of a chunk, by type id. Names stay indices into the metadata's string table:
/// copying them per class or field would let a small input that names one long string many
/// times take a lot of memory.
#[derive(Debug, Default)]
pub(crate) struct Types {
    /// The metadata event's string table.
    pub(crate) strings: Vec<String>,
    /// Type id → class.
    pub(crate) classes: HashMap<u64, Class>,
}

impl Types {
    /// The id of the class named `name`.
    pub(crate) fn id_of(&self, name: &str) -> Option<u64> {
        self.classes
            .iter()
            .find(|(_, class)| self.name(class.name) == name)
            .map(|(&id, _)| id)
    }

    /// The string at `index` of the table (indices are checked when read).
    pub(crate) fn name(&self, index: usize) -> &str {
        self.strings.get(index).map_or("", String::as_str)
    }

    /// The index of `class`'s field named `name`.
    pub(crate) fn field(&self, class: &Class, name: &str) -> Option<usize> {
        class.fields.iter().position(|f| self.name(f.name) == name)
    }
}

/// One element of the tree, its name and attributes as indices into the string table.
struct Element {
    name: usize,
    attributes: Vec<(usize, usize)>,
    children: Vec<Element>,
}

impl Element {
    fn is(&self, strings: &[String], name: &str) -> bool {
        strings.get(self.name).is_some_and(|s| s == name)
    }

    fn attribute_index(&self, strings: &[String], name: &str) -> Option<usize> {
        self.attributes
            .iter()
            .find(|&&(key, _)| strings.get(key).is_some_and(|s| s == name))
            .map(|&(_, value)| value)
    }

    fn attribute<'s>(&self, strings: &'s [String], name: &str) -> Option<&'s str> {
        self.attribute_index(strings, name)
            .and_then(|i| strings.get(i))
            .map(String::as_str)
    }
}

/// Reads the metadata event at the reader's position (its size field first).
pub(crate) fn read(r: &mut Reader<'_>) -> Result<Types, JfrError> {
    let start = r.offset();
    let size = r.count("metadata event size")?;
    // The size includes the size field itself.
    let header = r.offset() - start;
    let mut r = r.sub(size.checked_sub(header).ok_or(JfrError::Invalid {
        what: "metadata event size",
        offset: start,
        value: size as u64,
    })?)?;
    let type_offset = r.offset();
    let type_id = r.long()?;
    if type_id != 0 {
        return Err(JfrError::Invalid {
            what: "metadata event type",
            offset: type_offset,
            value: type_id,
        });
    }
    r.long()?; // start time
    r.long()?; // duration
    r.long()?; // metadata id
    let count = r.bounded_count("metadata string count")?;
    let mut strings = Vec::with_capacity(count);
    for _ in 0..count {
        let offset = r.offset();
        match r.string(true)? {
            JfrString::Text(text) => strings.push(text),
            JfrString::Null => strings.push(String::new()),
            JfrString::Pooled(_) => {
                return Err(JfrError::Invalid {
                    what: "metadata string encoding",
                    offset,
                    value: 2,
                });
            }
        }
    }
    let mut elements = 0;
    let root = element(&mut r, &strings, 0, &mut elements)?;
    let mut classes = HashMap::new();
    let s = strings.as_slice();
    for metadata in root.children.iter().filter(|e| e.is(s, "metadata")) {
        for class in metadata.children.iter().filter(|e| e.is(s, "class")) {
            let (Some(name), Some(id)) =
                (class.attribute_index(s, "name"), class.attribute(s, "id"))
            else {
                continue;
            };
            let Ok(id) = id.parse::<u64>() else { continue };
            let fields = class
                .children
                .iter()
                .filter(|e| e.is(s, "field"))
                .map(|f| Field {
                    name: f.attribute_index(s, "name").unwrap_or(usize::MAX),
                    type_id: f
                        .attribute(s, "class")
                        .and_then(|c| c.parse().ok())
                        .unwrap_or(u64::MAX),
                    pooled: f.attribute(s, "constantPool") == Some("true"),
                    array: f.attribute(s, "dimension").is_some_and(|d| d != "0"),
                })
                .collect();
            classes.insert(id, Class { name, fields });
        }
    }
    Ok(Types { strings, classes })
}

/// Reads one element and its subtree. Counts are checked against the remaining bytes (every
/// element and attribute takes at least one byte) and the depth is capped.
fn element(
    r: &mut Reader<'_>,
    strings: &[String],
    depth: usize,
    elements: &mut usize,
) -> Result<Element, JfrError> {
    if depth > MAX_ELEMENT_DEPTH {
        return Err(JfrError::TooDeep {
            offset: r.offset(),
            limit: MAX_ELEMENT_DEPTH,
        });
    }
    *elements += 1;
    if *elements > MAX_ELEMENTS {
        return Err(JfrError::Invalid {
            what: "metadata element count",
            offset: r.offset(),
            value: *elements as u64,
        });
    }
    let string = |r: &mut Reader<'_>| -> Result<usize, JfrError> {
        let offset = r.offset();
        let index = r.count("metadata string index")?;
        (index < strings.len())
            .then_some(index)
            .ok_or(JfrError::Invalid {
                what: "metadata string index",
                offset,
                value: index as u64,
            })
    };
    let name = string(r)?;
    let count = r.bounded_count("attribute count")?;
    let mut attributes = Vec::with_capacity(count);
    for _ in 0..count {
        let key = string(r)?;
        let value = string(r)?;
        attributes.push((key, value));
    }
    let count = r.bounded_count("element child count")?;
    let mut children = Vec::with_capacity(count);
    for _ in 0..count {
        children.push(element(r, strings, depth + 1, elements)?);
    }
    Ok(Element {
        name,
        attributes,
        children,
    })
}

//! Every key a configuration type reads, found from its `Deserialize` implementation rather
//! than from what it prints: the keys `print-default-config` leaves out (an `Option` that is
//! `None`, the fields of a list's entries, a map's entries) are found too.
//!
//! [`keys`] drives the type's deserializer down one path at a time: a struct names its fields
//! (`deserialize_struct`), a map gets one entry whose key is written `*`, a list is passed
//! through to its element type, an `Option` to its inner type, an enum to each of its variants
//! (`local: {path: …}` under `store.object-store`; an enum of unit variants, such as a
//! relabelling `action`, is a value). Whatever asks for a value (a number, a string, anything
//! untagged) is a key that holds a value: a leaf. Renamed
//! fields come out under the names the file uses (`kebab-case`), and aliases (a deprecated
//! name, a snake_case spelling) as keys of their own: serde lists them with the fields, and a
//! file may use them.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fmt;
use std::rc::Rc;

use serde::de::value::StrDeserializer;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, EnumAccess, IntoDeserializer, MapAccess, SeqAccess,
    VariantAccess,
};

/// The path segment that stands for any key of a map.
pub const ANY: &str = "*";

/// Every key of `T` that holds a value, as dot-separated paths (`ingest.quic.listen`,
/// `scrape-configs.static-configs.targets`, `metrics-export-rules.*.expr`); a section (a
/// struct) is not listed itself, its keys are.
///
/// # Panics
///
/// When `T` is not a struct, or a path cannot be followed (a bug in this walker).
pub fn keys<T: DeserializeOwned>() -> BTreeSet<String> {
    let mut leaves = BTreeSet::new();
    let mut pending = vec![Vec::<String>::new()];
    while let Some(route) = pending.pop() {
        let path = route.join(".");
        match explore::<T>(&route) {
            Found::Struct(fields) => {
                for field in fields {
                    let mut next = route.clone();
                    next.push((*field).to_owned());
                    pending.push(next);
                }
            }
            Found::Map => {
                let mut next = route.clone();
                next.push(ANY.to_owned());
                pending.push(next);
            }
            Found::Enum(variants) => {
                for variant in variants {
                    let mut next = route.clone();
                    next.push((*variant).to_owned());
                    match explore::<T>(&next) {
                        // A unit variant is the enum's value, written in place of a section.
                        Found::UnitVariant => {
                            leaves.insert(path.clone());
                        }
                        _ => pending.push(next),
                    }
                }
            }
            Found::UnitVariant => unreachable!("found one step below an enum"),
            Found::Leaf => {
                assert!(!route.is_empty(), "the configuration is not a struct");
                leaves.insert(path);
            }
        }
    }
    leaves
}

/// What stands at the end of a route.
#[derive(Clone, Debug)]
enum Found {
    Struct(&'static [&'static str]),
    Map,
    Enum(&'static [&'static str]),
    UnitVariant,
    Leaf,
}

/// Deserializes `T` down `route` and says what it found there.
fn explore<T: DeserializeOwned>(route: &[String]) -> Found {
    let found = Rc::new(RefCell::new(None));
    let walker = Walker {
        route,
        found: Rc::clone(&found),
    };
    // The walk always ends in an error once it has found what it looked for.
    let _ = T::deserialize(walker);
    let found = found.borrow().clone();
    found.unwrap_or_else(|| panic!("the walk down {route:?} found nothing"))
}

/// The error that ends every walk.
#[derive(Debug)]
struct Stop(String);

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Stop {}

impl de::Error for Stop {
    fn custom<M: fmt::Display>(message: M) -> Stop {
        Stop(message.to_string())
    }
}

/// A deserializer that follows `route` and records what it reaches.
struct Walker<'r> {
    route: &'r [String],
    found: Rc<RefCell<Option<Found>>>,
}

impl<'r> Walker<'r> {
    fn record(&self, found: Found) -> Stop {
        *self.found.borrow_mut() = Some(found);
        Stop("found".to_owned())
    }

    fn leaf(self) -> Stop {
        assert!(
            self.route.is_empty(),
            "a value where the route goes on: {:?}",
            self.route
        );
        self.record(Found::Leaf)
    }

    fn next(&self) -> Walker<'r> {
        Walker {
            route: &self.route[1..],
            found: Rc::clone(&self.found),
        }
    }
}

macro_rules! leaves {
    ($($method:ident),*) => {
        $(fn $method<V: de::Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(self.leaf())
        })*
    };
}

impl<'de> de::Deserializer<'de> for Walker<'_> {
    type Error = Stop;

    leaves!(
        deserialize_any,
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_unit,
        deserialize_identifier,
        deserialize_ignored_any
    );

    fn deserialize_option<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_some(self)
    }

    fn deserialize_unit_struct<V: de::Visitor<'de>>(
        self,
        _: &'static str,
        _: V,
    ) -> Result<V::Value, Stop> {
        Err(self.leaf())
    }

    fn deserialize_newtype_struct<V: de::Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, Stop> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_seq(One(Some(self)))
    }

    fn deserialize_tuple<V: de::Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value, Stop> {
        Err(self.leaf())
    }

    fn deserialize_tuple_struct<V: de::Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        _: V,
    ) -> Result<V::Value, Stop> {
        Err(self.leaf())
    }

    fn deserialize_map<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        let Some(first) = self.route.first() else {
            return Err(self.record(Found::Map));
        };
        assert_eq!(first, ANY, "a map's keys are written {ANY}");
        let next = self.next();
        visitor.visit_map(Entry(Some(("x", next))))
    }

    fn deserialize_struct<V: de::Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        let Some(first) = self.route.first() else {
            return Err(self.record(Found::Struct(fields)));
        };
        let field = fields
            .iter()
            .find(|field| *field == first)
            .unwrap_or_else(|| panic!("no field {first:?} in {fields:?}"));
        let next = self.next();
        visitor.visit_map(Entry(Some((field, next))))
    }

    fn deserialize_enum<V: de::Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        let Some(first) = self.route.first() else {
            return Err(self.record(Found::Enum(variants)));
        };
        let variant = variants
            .iter()
            .find(|variant| *variant == first)
            .unwrap_or_else(|| panic!("no variant {first:?} in {variants:?}"));
        let next = self.next();
        visitor.visit_enum(Variant(variant, next))
    }
}

/// An enum's variant, then what it holds walked on.
struct Variant<'r>(&'static str, Walker<'r>);

impl<'de, 'r> EnumAccess<'de> for Variant<'r> {
    type Error = Stop;
    type Variant = Walker<'r>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Walker<'r>), Stop> {
        let name: StrDeserializer<'_, Stop> = self.0.into_deserializer();
        Ok((seed.deserialize(name)?, self.1))
    }
}

impl<'de> VariantAccess<'de> for Walker<'_> {
    type Error = Stop;

    fn unit_variant(self) -> Result<(), Stop> {
        Err(self.record(Found::UnitVariant))
    }

    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<S::Value, Stop> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: de::Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value, Stop> {
        Err(self.leaf())
    }

    fn struct_variant<V: de::Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        de::Deserializer::deserialize_struct(self, "", fields, visitor)
    }
}

/// A list of one element, walked on.
struct One<'r>(Option<Walker<'r>>);

impl<'de> SeqAccess<'de> for One<'_> {
    type Error = Stop;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Stop> {
        match self.0.take() {
            Some(walker) => seed.deserialize(walker).map(Some),
            None => Ok(None),
        }
    }
}

/// A map of one entry: a key, then its value walked on.
struct Entry<'r>(Option<(&'static str, Walker<'r>)>);

impl<'de> MapAccess<'de> for Entry<'_> {
    type Error = Stop;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Stop> {
        match &self.0 {
            Some((key, _)) => {
                let key: StrDeserializer<'_, Stop> = key.into_deserializer();
                seed.deserialize(key).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Stop> {
        let (_, walker) = self.0.take().expect("a value after its key");
        seed.deserialize(walker)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use serde::Deserialize;

    use super::*;

    #[allow(dead_code, reason = "only deserialized, to be walked")]
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "kebab-case")]
    struct Config {
        plain_number: u64,
        #[serde(default)]
        optional_section: Option<Section>,
        list_of_sections: Vec<Section>,
        list_of_strings: Vec<String>,
        rules: BTreeMap<String, Section>,
        tokens: BTreeMap<String, String>,
        #[serde(with = "seconds", alias = "old-name")]
        custom: Duration,
        kind: Kind,
        store: Store,
    }

    #[allow(dead_code, reason = "only deserialized, to be walked")]
    #[derive(Deserialize)]
    #[serde(rename_all = "kebab-case")]
    enum Store {
        Local(Deeper),
        Remote { url: String },
    }

    #[allow(dead_code, reason = "only deserialized, to be walked")]
    #[derive(Deserialize)]
    #[serde(rename_all = "kebab-case")]
    struct Section {
        inner_value: String,
        deeper: Option<Deeper>,
    }

    #[allow(dead_code, reason = "only deserialized, to be walked")]
    #[derive(Deserialize)]
    struct Deeper {
        leaf: bool,
    }

    #[allow(dead_code, reason = "only deserialized, to be walked")]
    #[derive(Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Kind {
        One,
        Two,
    }

    mod seconds {
        use std::time::Duration;

        use serde::{Deserialize, Deserializer};

        pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
            Ok(Duration::from_secs(u64::deserialize(d)?))
        }
    }

    #[test]
    fn every_key_and_alias_is_found_through_options_lists_and_maps() {
        let found: Vec<String> = keys::<Config>().into_iter().collect();
        assert_eq!(
            found,
            [
                "custom",
                "kind",
                "list-of-sections.deeper.leaf",
                "list-of-sections.inner-value",
                "list-of-strings",
                "old-name",
                "optional-section.deeper.leaf",
                "optional-section.inner-value",
                "plain-number",
                "rules.*.deeper.leaf",
                "rules.*.inner-value",
                "store.local.leaf",
                "store.remote.url",
                "tokens.*",
            ]
        );
    }
}

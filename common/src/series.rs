//! Series identity: an app name and a sorted set of labels, parsed from Pyroscope ingest names.
//!
//! Input: the `name` parameter of `POST /ingest` (or any name an agent builds), such as
//! `checkout.cpu{env=staging,region=us-west-1}`. Output: a [`Series`], whose `Display` is the
//! normalized key `checkout.cpu{env=staging,region=us-west-1}` that the store indexes by.
//! Callers: the aggregator's ingest path, the agent's window (which names its series), and the
//! query path (which matches them with a [`Selector`](crate::Selector)).
//!
//! # Syntax
//!
//! `app{name=value,name=value}`, as Pyroscope's `ParseKey` reads it:
//!
//! - The **app name** is required and uses `[A-Za-z0-9_.-]`. By convention its last dot segment is
//!   the profile type: [`Series::service`] and [`Series::profile_type`] split it.
//! - **Label names** use `[A-Za-z0-9_.]`: Pyroscope allows `[A-Za-z0-9_]`, and Smolder adds the dot
//!   so that OpenTelemetry-style names such as `process.runtime.name` pass through.
//! - **Values** are unquoted: a value ends at `,` or `}`, is trimmed of whitespace, and has no
//!   escapes. A value may also be double-quoted, as in a query (`{env="prod"}`), so that a name
//!   copied from a selector works at ingest; inside quotes `\\`, `\"`, `\n` and `\t` are unescaped
//!   and any other backslash is kept as written.
//! - Braces are optional, `{}` is fine, a trailing comma is fine, and whitespace around the name,
//!   the braces, label names and values is ignored.
//! - A `__name__=x` label replaces the app name, as Pyroscope does (it stores the app name as that
//!   label). It is not kept as a label.
//! - A label with an empty value is the same as no label, as in Prometheus and in Pyroscope's
//!   `Key.Add`: `app{env=}` is `app{}`. Selectors rely on this (a missing label reads as empty).
//!
//! Where Smolder is stricter than Pyroscope, which silently accepts and drops: a duplicate label
//! name, a label without `=`, an empty label name and anything but whitespace after the closing
//! `}` are errors, each reported with the byte position of the offending character.
//!
//! # Normalized form
//!
//! [`Series`]'s `Display` writes the app name, then the labels sorted by name inside braces, with
//! braces even when there are no labels: `app{}`. That is exactly Pyroscope's `Key.Normalized()`,
//! so keys and label sets carried over from Pyroscope keep their identity. A value is written
//! unquoted unless it could not be read back that way (it contains `,`, `}`, `"` or `\`, or starts
//! or ends with whitespace); then it is quoted and escaped. Parsing the display of any series gives
//! the same series.
//!
//! ```
//! use smolder_common::Series;
//!
//! let series: Series = " checkout.cpu{ region = us-west-1, env=\"staging\" }".parse()?;
//! assert_eq!(series.service(), "checkout");
//! assert_eq!(series.profile_type(), Some("cpu"));
//! assert_eq!(series.labels().get("env"), Some("staging"));
//! assert_eq!(series.to_string(), "checkout.cpu{env=staging,region=us-west-1}");
//! # Ok::<(), smolder_common::SeriesError>(())
//! ```

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

/// The label under which Pyroscope stores the app name. At ingest it overrides the app name.
pub const NAME_LABEL: &str = "__name__";

/// What the app-name character set is, for error messages.
const APP_CHARS: &str = "a letter, digit, '_', '.' or '-'";
/// What the label-name character set is, for error messages.
const LABEL_CHARS: &str = "a letter, digit, '_' or '.'";

/// Why a series name could not be parsed, or a series or label built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SeriesError {
    /// A character is not allowed where it appears (in the app name, a label name, or after a
    /// quoted value).
    #[error("invalid character {found:?} in {context} at position {position}, expected {expected}")]
    InvalidCharacter {
        /// The character found.
        found: char,
        /// Its byte offset in the input.
        position: usize,
        /// The part of the name being read.
        context: &'static str,
        /// What would have been accepted there.
        expected: &'static str,
    },
    /// The input ends inside the label set.
    #[error("unexpected end of input in {context} at position {position}, expected {expected}")]
    UnexpectedEnd {
        /// The input's length.
        position: usize,
        /// The part of the name being read.
        context: &'static str,
        /// What would have been accepted there.
        expected: &'static str,
    },
    /// There is no app name before the labels (or the input is empty), or `__name__` is empty.
    #[error("missing app name at position {position}")]
    MissingAppName {
        /// Where the app name should start.
        position: usize,
    },
    /// A label has a value but no name, as in `{=x}`.
    #[error("missing label name at position {position}")]
    MissingLabelName {
        /// Where the label name should start.
        position: usize,
    },
    /// The same label name appears twice.
    #[error("duplicate label {name:?} at position {position}")]
    DuplicateLabel {
        /// The label name.
        name: String,
        /// Where its second occurrence starts.
        position: usize,
    },
    /// A quoted value has no closing quote.
    #[error("unterminated quoted value starting at position {position}")]
    UnterminatedValue {
        /// Where the opening quote is.
        position: usize,
    },
    /// Something other than whitespace follows the closing `}`.
    #[error("unexpected character {found:?} after the labels at position {position}")]
    TrailingCharacters {
        /// The first such character.
        found: char,
        /// Its byte offset in the input.
        position: usize,
    },
    /// [`Series::new`] was given an app name that is empty or has a character outside
    /// `[A-Za-z0-9_.-]`.
    #[error("invalid app name {name:?}, expected one or more of {APP_CHARS}")]
    InvalidAppName {
        /// The name given.
        name: String,
    },
    /// [`Labels::insert`] was given a label name that is empty or has a character outside
    /// `[A-Za-z0-9_.]`.
    #[error("invalid label name {name:?}, expected one or more of {LABEL_CHARS}")]
    InvalidLabelName {
        /// The name given.
        name: String,
    },
    /// [`Labels::insert`] was given `__name__`, which is the app name and not a label.
    #[error("label name {NAME_LABEL:?} is reserved for the app name")]
    ReservedLabelName,
}

/// Whether `c` may appear in an app name: `[A-Za-z0-9_.-]`. The one definition of the rule;
/// every stage that checks or builds an app name uses it.
pub fn is_app_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
}

/// Whether `c` may appear in a label name: `[A-Za-z0-9_.]`.
pub fn is_label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.')
}

/// Whether `name` is a valid app name.
pub fn is_app_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(is_app_char)
}

/// Whether `name` is a valid label name (`__name__` included).
pub fn is_label_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(is_label_char)
}

/// `name` with every character outside the app-name set replaced by `_`, for names taken from
/// elsewhere (an executable, an SDK's service name) that must not lose their profile over a
/// `/`. An empty name stays empty.
pub fn sanitize_app_name(name: &str) -> String {
    name.chars()
        .map(|c| if is_app_char(c) { c } else { '_' })
        .collect()
}

/// `name` with every character outside the label-name set replaced by `_`, for label names
/// taken from elsewhere (pprof labels such as `http-route`), as Pyroscope sanitizes them.
pub fn sanitize_label_name(name: &str) -> String {
    name.chars()
        .map(|c| if is_label_char(c) { c } else { '_' })
        .collect()
}

/// A sorted set of label names and values. Names are unique and valid; values are never empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Labels {
    /// Sorted by name. A series has a handful of labels, so a sorted vector beats a map on both
    /// memory and lookups.
    pairs: Vec<(String, String)>,
}

impl Labels {
    /// An empty label set.
    pub fn new() -> Labels {
        Labels::default()
    }

    /// Builds a label set from pairs, in any order. Pairs with an empty value are skipped.
    ///
    /// # Errors
    ///
    /// [`SeriesError::InvalidLabelName`] or [`SeriesError::ReservedLabelName`] for a bad name,
    /// and [`SeriesError::DuplicateLabel`] (with position 0) for a name given twice.
    pub fn from_pairs<I, N, V>(pairs: I) -> Result<Labels, SeriesError>
    where
        I: IntoIterator<Item = (N, V)>,
        N: Into<String>,
        V: Into<String>,
    {
        let mut all = Vec::new();
        for (name, value) in pairs {
            let name = name.into();
            if name == NAME_LABEL {
                return Err(SeriesError::ReservedLabelName);
            }
            if !is_label_name(&name) {
                return Err(SeriesError::InvalidLabelName { name });
            }
            all.push((name, value.into()));
        }
        Labels::from_unsorted(all).map_err(|name| SeriesError::DuplicateLabel { name, position: 0 })
    }

    /// Sorts valid pairs once and drops empty values; on a duplicate name, returns that name.
    fn from_unsorted(mut pairs: Vec<(String, String)>) -> Result<Labels, String> {
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(pair) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(pair[0].0.clone());
        }
        pairs.retain(|(_, value)| !value.is_empty());
        Ok(Labels { pairs })
    }

    /// The value of label `name`, if the set has it.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.find(name).ok().map(|i| self.pairs[i].1.as_str())
    }

    /// Whether the set has label `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.find(name).is_ok()
    }

    /// Sets label `name` to `value` and returns the value it replaces. An empty value removes the
    /// label, since a missing label and an empty one mean the same.
    ///
    /// # Errors
    ///
    /// [`SeriesError::InvalidLabelName`] if `name` is empty or has a character outside
    /// `[A-Za-z0-9_.]`, [`SeriesError::ReservedLabelName`] if it is `__name__`.
    pub fn insert(
        &mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<Option<String>, SeriesError> {
        let name = name.into();
        if name == NAME_LABEL {
            return Err(SeriesError::ReservedLabelName);
        }
        if !is_label_name(&name) {
            return Err(SeriesError::InvalidLabelName { name });
        }
        let value = value.into();
        if value.is_empty() {
            return Ok(self.remove(&name));
        }
        Ok(match self.find(&name) {
            Ok(i) => Some(std::mem::replace(&mut self.pairs[i].1, value)),
            Err(i) => {
                self.pairs.insert(i, (name, value));
                None
            }
        })
    }

    /// Removes label `name` and returns its value.
    pub fn remove(&mut self, name: &str) -> Option<String> {
        let i = self.find(name).ok()?;
        Some(self.pairs.remove(i).1)
    }

    /// The labels as `(name, value)` pairs, sorted by name.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.pairs.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// The number of labels.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether there are no labels.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    fn find(&self, name: &str) -> Result<usize, usize> {
        self.pairs.binary_search_by(|(n, _)| n.as_str().cmp(name))
    }
}

/// Writes the labels as `{name=value,...}`, sorted, quoting only values that need it.
impl fmt::Display for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (name, value)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{name}=")?;
            if needs_quotes(value) {
                write_quoted(f, value)?;
            } else {
                f.write_str(value)?;
            }
        }
        f.write_str("}")
    }
}

/// Whether an unquoted value would not read back as itself.
fn needs_quotes(value: &str) -> bool {
    value.contains([',', '}', '"', '\\'])
        || value.starts_with(char::is_whitespace)
        || value.ends_with(char::is_whitespace)
}

/// Writes `value` double-quoted, escaping what [`Cursor::quoted`] unescapes.
pub(crate) fn write_quoted(f: &mut fmt::Formatter<'_>, value: &str) -> fmt::Result {
    f.write_str("\"")?;
    for c in value.chars() {
        match c {
            '\\' => f.write_str("\\\\")?,
            '"' => f.write_str("\\\"")?,
            '\n' => f.write_str("\\n")?,
            '\t' => f.write_str("\\t")?,
            c => write!(f, "{c}")?,
        }
    }
    f.write_str("\"")
}

/// One profile series: an app name and labels.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Series {
    app: String,
    labels: Labels,
}

impl Series {
    /// A series from an app name (such as `checkout.cpu`) and labels.
    ///
    /// # Errors
    ///
    /// [`SeriesError::InvalidAppName`] if `app` is empty or has a character outside
    /// `[A-Za-z0-9_.-]`.
    pub fn new(app: impl Into<String>, labels: Labels) -> Result<Series, SeriesError> {
        let app = app.into();
        if !is_app_name(&app) {
            return Err(SeriesError::InvalidAppName { name: app });
        }
        Ok(Series { app, labels })
    }

    /// Parses a Pyroscope ingest name such as `checkout.cpu{env=staging,region=us-west-1}`; see
    /// the [module docs](self) for the syntax.
    ///
    /// # Errors
    ///
    /// A [`SeriesError`] naming the byte position of the first thing that is wrong and what was
    /// expected there.
    pub fn parse(input: &str) -> Result<Series, SeriesError> {
        let mut cur = Cursor::new(input);
        cur.skip_whitespace();
        let app_start = cur.pos;
        let app = cur.take_while(is_app_char);
        if app.is_empty() {
            return match cur.peek() {
                None | Some('{') => Err(SeriesError::MissingAppName {
                    position: app_start,
                }),
                Some(found) => Err(SeriesError::InvalidCharacter {
                    found,
                    position: app_start,
                    context: "app name",
                    expected: APP_CHARS,
                }),
            };
        }
        let mut app = app.to_owned();
        cur.skip_whitespace();
        match cur.peek() {
            None => {
                return Ok(Series {
                    app,
                    labels: Labels::new(),
                });
            }
            Some('{') => cur.bump(),
            Some(found) => {
                return Err(SeriesError::InvalidCharacter {
                    found,
                    position: cur.pos,
                    context: "app name",
                    expected: "a letter, digit, '_', '.', '-' or '{'",
                });
            }
        }
        // Pairs in input order, empty values included so that a duplicate is caught even when
        // the first value was empty; sorted once at the end. The set keeps a hostile name with
        // thousands of labels linear.
        let mut pairs = Vec::new();
        let mut seen = HashSet::new();
        let mut name_override = None;
        loop {
            cur.skip_whitespace();
            let name_start = cur.pos;
            let name = cur.take_while(is_label_char);
            if name.is_empty() {
                match cur.peek() {
                    Some('}') => {
                        cur.bump();
                        break;
                    }
                    Some('=') => {
                        return Err(SeriesError::MissingLabelName {
                            position: name_start,
                        });
                    }
                    Some(found) => {
                        return Err(SeriesError::InvalidCharacter {
                            found,
                            position: cur.pos,
                            context: "label name",
                            expected: "a letter, digit, '_', '.' or '}'",
                        });
                    }
                    None => return Err(cur.unexpected_end("labels", "a label name or '}'")),
                }
            }
            cur.skip_whitespace();
            match cur.peek() {
                Some('=') => cur.bump(),
                Some(found) => {
                    return Err(SeriesError::InvalidCharacter {
                        found,
                        position: cur.pos,
                        context: "label name",
                        expected: "a letter, digit, '_', '.' or '='",
                    });
                }
                None => return Err(cur.unexpected_end("label name", "'='")),
            }
            if !seen.insert(name) {
                return Err(SeriesError::DuplicateLabel {
                    name: name.to_owned(),
                    position: name_start,
                });
            }
            cur.skip_whitespace();
            let value_start = cur.pos;
            let (value, end) = if cur.peek() == Some('"') {
                let value = cur.quoted().map_err(SeriesError::from)?;
                cur.skip_whitespace();
                match cur.peek() {
                    Some(c @ (',' | '}')) => (value, c),
                    Some(found) => {
                        return Err(SeriesError::InvalidCharacter {
                            found,
                            position: cur.pos,
                            context: "labels",
                            expected: "',' or '}' after a quoted value",
                        });
                    }
                    None => return Err(cur.unexpected_end("labels", "',' or '}'")),
                }
            } else {
                let raw = cur.take_while(|c| c != ',' && c != '}');
                match cur.peek() {
                    Some(c) => (raw.trim().to_owned(), c),
                    None => return Err(cur.unexpected_end("label value", "',' or '}'")),
                }
            };
            cur.bump();
            if name == NAME_LABEL {
                name_override = Some((value, value_start));
            } else {
                pairs.push((name.to_owned(), value));
            }
            if end == '}' {
                break;
            }
        }
        cur.skip_whitespace();
        if let Some(found) = cur.peek() {
            return Err(SeriesError::TrailingCharacters {
                found,
                position: cur.pos,
            });
        }
        if let Some((name, position)) = name_override {
            if name.is_empty() {
                return Err(SeriesError::MissingAppName { position });
            }
            if let Some((offset, found)) = name.char_indices().find(|&(_, c)| !is_app_char(c)) {
                // The offset is into the unescaped value; for the unquoted values Pyroscope
                // allows it is also the offset into the input.
                return Err(SeriesError::InvalidCharacter {
                    found,
                    position: position + offset,
                    context: "__name__ value",
                    expected: APP_CHARS,
                });
            }
            app = name;
        }
        let labels =
            Labels::from_unsorted(pairs).expect("duplicate names are rejected as they are read");
        Ok(Series { app, labels })
    }

    /// The full app name, such as `checkout.cpu`.
    pub fn app(&self) -> &str {
        &self.app
    }

    /// The app name without its profile type: `checkout` for `checkout.cpu`. The whole app name
    /// when it has no dot.
    pub fn service(&self) -> &str {
        self.app
            .rsplit_once('.')
            .map_or(&self.app, |(service, _)| service)
    }

    /// The profile type, by Pyroscope's convention the app name's last dot segment: `cpu` for
    /// `checkout.cpu`. `None` when the app name has no dot or ends with one.
    pub fn profile_type(&self) -> Option<&str> {
        self.app
            .rsplit_once('.')
            .map(|(_, ty)| ty)
            .filter(|ty| !ty.is_empty())
    }

    /// The labels.
    pub fn labels(&self) -> &Labels {
        &self.labels
    }

    /// The labels, to change. [`Labels`] keeps itself valid, so the series stays valid.
    pub fn labels_mut(&mut self) -> &mut Labels {
        &mut self.labels
    }
}

impl FromStr for Series {
    type Err = SeriesError;

    fn from_str(s: &str) -> Result<Series, SeriesError> {
        Series::parse(s)
    }
}

/// Writes the normalized key, `app{name=value,...}`; see the [module docs](self).
impl fmt::Display for Series {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.app, self.labels)
    }
}

/// Why a quoted string could not be read. Shared by the series and selector parsers, which turn
/// it into their own error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuoteError {
    /// No closing quote; the position is the opening one.
    Unterminated { position: usize },
}

impl From<QuoteError> for SeriesError {
    fn from(err: QuoteError) -> SeriesError {
        match err {
            QuoteError::Unterminated { position } => SeriesError::UnterminatedValue { position },
        }
    }
}

/// A position in a name or query being parsed. Positions are byte offsets into the input.
pub(crate) struct Cursor<'a> {
    input: &'a str,
    pub(crate) pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(input: &'a str) -> Cursor<'a> {
        Cursor { input, pos: 0 }
    }

    /// The next character, if any.
    pub(crate) fn peek(&self) -> Option<char> {
        self.input.get(self.pos..)?.chars().next()
    }

    /// Moves past `s` if the rest of the input starts with it.
    pub(crate) fn eat(&mut self, s: &str) -> bool {
        let found = self
            .input
            .get(self.pos..)
            .is_some_and(|rest| rest.starts_with(s));
        if found {
            self.pos += s.len();
        }
        found
    }

    /// Moves past the next character.
    pub(crate) fn bump(&mut self) {
        if let Some(c) = self.peek() {
            self.pos += c.len_utf8();
        }
    }

    /// Moves past the characters that satisfy `pred` and returns them.
    pub(crate) fn take_while(&mut self, mut pred: impl FnMut(char) -> bool) -> &'a str {
        let start = self.pos;
        while let Some(c) = self.peek() {
            if !pred(c) {
                break;
            }
            self.pos += c.len_utf8();
        }
        &self.input[start..self.pos]
    }

    pub(crate) fn skip_whitespace(&mut self) {
        self.take_while(char::is_whitespace);
    }

    fn unexpected_end(&self, context: &'static str, expected: &'static str) -> SeriesError {
        SeriesError::UnexpectedEnd {
            position: self.pos,
            context,
            expected,
        }
    }

    /// Reads a double-quoted string starting at the cursor (which must be on the `"`),
    /// unescaping `\\`, `\"`, `\n` and `\t`. Any other backslash is kept with the character after
    /// it, so that a regex written for Pyroscope, which does not unescape (`"1\..*"`), means the
    /// same here.
    pub(crate) fn quoted(&mut self) -> Result<String, QuoteError> {
        let start = self.pos;
        self.bump();
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(QuoteError::Unterminated { position: start });
            };
            self.bump();
            match c {
                '"' => return Ok(out),
                '\\' => {
                    let Some(next) = self.peek() else {
                        return Err(QuoteError::Unterminated { position: start });
                    };
                    self.bump();
                    match next {
                        '\\' => out.push('\\'),
                        '"' => out.push('"'),
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        other => {
                            out.push('\\');
                            out.push(other);
                        }
                    }
                }
                c => out.push(c),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(app: &str, pairs: &[(&str, &str)]) -> Series {
        let labels = Labels::from_pairs(pairs.iter().copied()).expect("valid test labels");
        Series::new(app, labels).expect("valid test app name")
    }

    fn err(input: &str) -> SeriesError {
        Series::parse(input).expect_err(input)
    }

    #[test]
    fn parses_the_documented_example() {
        let s = Series::parse("app.name.cpu{env=staging,region=us-west-1}").unwrap();
        assert_eq!(
            s,
            series(
                "app.name.cpu",
                &[("env", "staging"), ("region", "us-west-1")]
            )
        );
        assert_eq!(s.app(), "app.name.cpu");
        assert_eq!(s.service(), "app.name");
        assert_eq!(s.profile_type(), Some("cpu"));
        assert_eq!(s.to_string(), "app.name.cpu{env=staging,region=us-west-1}");
    }

    #[test]
    fn parses_pyroscope_key_test_cases() {
        // From Pyroscope's segment key tests.
        assert_eq!(Series::parse("foo").unwrap(), series("foo", &[]));
        assert_eq!(
            Series::parse("foo{bar=1,baz=2}").unwrap(),
            series("foo", &[("bar", "1"), ("baz", "2")])
        );
        assert_eq!(
            Series::parse(" foo { bar = 1 , baz = 2 } ").unwrap(),
            series("foo", &[("bar", "1"), ("baz", "2")])
        );
    }

    #[test]
    fn braces_are_optional_and_may_be_empty() {
        assert_eq!(Series::parse("app.cpu{}").unwrap(), series("app.cpu", &[]));
        assert_eq!(
            Series::parse("app.cpu { } ").unwrap(),
            series("app.cpu", &[])
        );
        assert_eq!(Series::parse("app.cpu").unwrap().to_string(), "app.cpu{}");
    }

    #[test]
    fn sorts_labels_and_accepts_a_trailing_comma() {
        let s = Series::parse("a{z=1,b=2,m=3,}").unwrap();
        assert_eq!(s.to_string(), "a{b=2,m=3,z=1}");
        let names: Vec<_> = s.labels().iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["b", "m", "z"]);
    }

    #[test]
    fn accepts_dotted_label_names() {
        let s = Series::parse("app.cpu{process.runtime.name=go}").unwrap();
        assert_eq!(s.labels().get("process.runtime.name"), Some("go"));
    }

    #[test]
    fn unquoted_values_run_to_comma_or_brace_without_escapes() {
        let s = Series::parse(r#"a{url=/x?a=b{c}"#).unwrap();
        assert_eq!(s.labels().get("url"), Some("/x?a=b{c"));
        let s = Series::parse(r#"a{p=C:\dir\ x ,q=say "hi"}"#).unwrap();
        assert_eq!(s.labels().get("p"), Some(r"C:\dir\ x"));
        assert_eq!(s.labels().get("q"), Some(r#"say "hi""#));
    }

    #[test]
    fn accepts_quoted_values_with_escapes() {
        let s = Series::parse(r#"app.cpu{env="prod", msg = "a,b}\"c\\d\n" , re="1\..*"}"#).unwrap();
        assert_eq!(s.labels().get("env"), Some("prod"));
        assert_eq!(s.labels().get("msg"), Some("a,b}\"c\\d\n"));
        assert_eq!(s.labels().get("re"), Some(r"1\..*"));
    }

    #[test]
    fn quotes_values_in_display_only_when_needed() {
        let s = series("a", &[("x", "a,b"), ("y", " pad"), ("z", "plain value")]);
        assert_eq!(s.to_string(), r#"a{x="a,b",y=" pad",z=plain value}"#);
        assert_eq!(Series::parse(&s.to_string()).unwrap(), s);
    }

    #[test]
    fn empty_values_are_missing_labels() {
        assert_eq!(
            Series::parse("a{env=,b=1}").unwrap(),
            series("a", &[("b", "1")])
        );
        assert_eq!(Series::parse(r#"a{env=""}"#).unwrap(), series("a", &[]));
        assert_eq!(
            err("a{env=,env=x}"),
            SeriesError::DuplicateLabel {
                name: "env".into(),
                position: 7
            }
        );
    }

    #[test]
    fn name_label_overrides_the_app_name() {
        let s = Series::parse("ignored.cpu{__name__=real.cpu,env=prod}").unwrap();
        assert_eq!(s, series("real.cpu", &[("env", "prod")]));
        assert_eq!(
            err("a{__name__=bad!}"),
            SeriesError::InvalidCharacter {
                found: '!',
                position: 14,
                context: "__name__ value",
                expected: APP_CHARS,
            }
        );
        assert_eq!(
            err("a{__name__=}"),
            SeriesError::MissingAppName { position: 11 }
        );
    }

    #[test]
    fn splits_service_and_profile_type() {
        assert_eq!(series("checkout", &[]).service(), "checkout");
        assert_eq!(series("checkout", &[]).profile_type(), None);
        assert_eq!(series("checkout.", &[]).profile_type(), None);
        assert_eq!(series("a.b.alloc_space", &[]).service(), "a.b");
        assert_eq!(
            series("a.b.alloc_space", &[]).profile_type(),
            Some("alloc_space")
        );
    }

    #[test]
    fn reports_the_position_of_each_error() {
        assert_eq!(
            err("app.cpu{e!v=1}").to_string(),
            "invalid character '!' in label name at position 9, \
             expected a letter, digit, '_', '.' or '='"
        );
        assert_eq!(err(""), SeriesError::MissingAppName { position: 0 });
        assert_eq!(err("  {a=1}"), SeriesError::MissingAppName { position: 2 });
        assert_eq!(
            err("my app"),
            SeriesError::InvalidCharacter {
                found: 'a',
                position: 3,
                context: "app name",
                expected: "a letter, digit, '_', '.', '-' or '{'",
            }
        );
        assert_eq!(
            err("!app"),
            SeriesError::InvalidCharacter {
                found: '!',
                position: 0,
                context: "app name",
                expected: APP_CHARS,
            }
        );
        assert_eq!(err("a{=1}"), SeriesError::MissingLabelName { position: 2 });
        assert_eq!(
            err("a{b=1,-c=2}"),
            SeriesError::InvalidCharacter {
                found: '-',
                position: 6,
                context: "label name",
                expected: "a letter, digit, '_', '.' or '}'",
            }
        );
        assert_eq!(
            err("a{b}"),
            SeriesError::InvalidCharacter {
                found: '}',
                position: 3,
                context: "label name",
                expected: "a letter, digit, '_', '.' or '='",
            }
        );
        assert_eq!(
            err("a{b=1,b=2}"),
            SeriesError::DuplicateLabel {
                name: "b".into(),
                position: 6
            }
        );
        assert_eq!(
            err("a{b=1"),
            SeriesError::UnexpectedEnd {
                position: 5,
                context: "label value",
                expected: "',' or '}'",
            }
        );
        assert_eq!(
            err("a{b"),
            SeriesError::UnexpectedEnd {
                position: 3,
                context: "label name",
                expected: "'='",
            }
        );
        assert_eq!(
            err("a{"),
            SeriesError::UnexpectedEnd {
                position: 2,
                context: "labels",
                expected: "a label name or '}'",
            }
        );
        assert_eq!(
            err(r#"a{b="x}"#),
            SeriesError::UnterminatedValue { position: 4 }
        );
        assert_eq!(
            err(r#"a{b="x\"#),
            SeriesError::UnterminatedValue { position: 4 }
        );
        assert_eq!(
            err(r#"a{b="x" y}"#),
            SeriesError::InvalidCharacter {
                found: 'y',
                position: 8,
                context: "labels",
                expected: "',' or '}' after a quoted value",
            }
        );
        assert_eq!(
            err(r#"a{b="x""#),
            SeriesError::UnexpectedEnd {
                position: 7,
                context: "labels",
                expected: "',' or '}'",
            }
        );
        assert_eq!(
            err("a{b=1} x"),
            SeriesError::TrailingCharacters {
                found: 'x',
                position: 7
            }
        );
        assert_eq!(
            err("a{b=1}}"),
            SeriesError::TrailingCharacters {
                found: '}',
                position: 6
            }
        );
    }

    #[test]
    fn many_labels_parse_quickly() {
        // Quadratic duplicate checks or sorted inserts would take seconds here.
        let pairs: Vec<String> = (0..50_000).rev().map(|i| format!("l{i}=v")).collect();
        let s = Series::parse(&format!("a{{{}}}", pairs.join(","))).unwrap();
        assert_eq!(s.labels().len(), 50_000);
        assert_eq!(s.labels().get("l49999"), Some("v"));
    }

    #[test]
    fn positions_are_byte_offsets() {
        assert_eq!(
            err("a{é=1}"),
            SeriesError::InvalidCharacter {
                found: 'é',
                position: 2,
                context: "label name",
                expected: "a letter, digit, '_', '.' or '}'",
            }
        );
        assert_eq!(
            err("a{b=é}x"),
            SeriesError::TrailingCharacters {
                found: 'x',
                position: 7
            }
        );
    }

    #[test]
    fn labels_validate_names_and_drop_empty_values() {
        let mut labels = Labels::new();
        assert_eq!(labels.insert("env", "prod"), Ok(None));
        assert_eq!(labels.insert("env", "dev"), Ok(Some("prod".into())));
        assert_eq!(labels.insert("env", ""), Ok(Some("dev".into())));
        assert!(labels.is_empty());
        assert_eq!(
            labels.insert("bad name", "x"),
            Err(SeriesError::InvalidLabelName {
                name: "bad name".into()
            })
        );
        assert_eq!(
            labels.insert("", "x"),
            Err(SeriesError::InvalidLabelName { name: "".into() })
        );
        assert_eq!(
            labels.insert(NAME_LABEL, "x"),
            Err(SeriesError::ReservedLabelName)
        );
        assert_eq!(
            Labels::from_pairs([("a", "1"), ("a", "2")]),
            Err(SeriesError::DuplicateLabel {
                name: "a".into(),
                position: 0
            })
        );
        assert_eq!(
            Series::new("a b", Labels::new()),
            Err(SeriesError::InvalidAppName { name: "a b".into() })
        );
    }
}

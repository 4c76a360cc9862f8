//! FlameQL selectors: which series a query reads.
//!
//! Input: the `query` parameter of `/render` and friends, such as
//! `checkout.cpu{env="prod", version=~"1\\..*"}`. Output: a [`Selector`] that
//! [`matches`](Selector::matches) [`Series`]. Callers: the aggregator's query path and rule
//! evaluation.
//!
//! # Regexes are anchored, unlike Pyroscope v0
//!
//! **`=~` and `!~` match the whole value, as in Prometheus and Pyroscope v1+.** Pyroscope v0's
//! FlameQL left them unanchored, so there `version=~"1.*"` matched any value *containing* a `1`
//! (`21`, `0.1`); here it matches only values *starting* with `1`. A v0 query that relied on
//! substring matching needs `.*` added around its pattern: `version=~".*1.*"`. The pattern is
//! compiled as `^(?:pattern)$` with the [`regex`] crate (RE2 syntax, like Go's), and the
//! compiled size of a selector's regexes is capped by [`REGEX_SIZE_LIMIT`] so that a hostile
//! query cannot eat the aggregator's memory.
//!
//! # Syntax
//!
//! `app` or `app{matcher, matcher, ...}`, where a matcher is `name op "value"`:
//!
//! - The **app name** is required and matched exactly (no regex), charset `[A-Za-z0-9_.-]`.
//! - **Label names** use `[A-Za-z0-9_.]`, as in [`series`](crate::series). `__name__` is rejected:
//!   the app name goes before the braces.
//! - **Operators**: `=` (equal), `!=` (not equal), `=~` (regex matches), `!~` (regex does not
//!   match).
//! - **Values must be double-quoted.** Inside quotes `\\`, `\"`, `\n` and `\t` are unescaped, so
//!   the query text `version=~"1\\..*"` yields the regex `1\..*`. Any other backslash is kept as
//!   written, so `"1\..*"` yields the same regex: that is how Pyroscope v0, which unescapes
//!   nothing, reads it, and such queries keep working.
//! - Whitespace around the app name, braces, names, operators and values is ignored; commas inside
//!   quotes are part of the value; a trailing comma and empty braces are fine.
//!
//! # Missing labels
//!
//! A series that lacks a label is matched as if it had that label with the empty value, as in
//! Prometheus (and series never store empty values, see [`Labels::insert`](crate::Labels::insert)).
//! Pyroscope v0 instead fails every positive matcher and passes every negative one on a missing
//! label. The two agree except for patterns that match the empty string: here `env=""` and
//! `env=~".*"` select series *without* `env` (Pyroscope: none), and `env!=""` and `env!~".*"`
//! reject them (Pyroscope: accept).
//!
//! ```
//! use smolder_common::{Selector, Series};
//!
//! let selector: Selector = r#"checkout.cpu{env="prod", version=~"1\\..*"}"#.parse()?;
//! assert!(selector.matches(&"checkout.cpu{env=prod,version=1.4.2}".parse::<Series>()?));
//! assert!(!selector.matches(&"checkout.cpu{env=prod,version=21.0}".parse::<Series>()?));
//! assert!(!selector.matches(&"checkout.cpu{version=1.4.2}".parse::<Series>()?));
//! assert_eq!(selector.to_string(), r#"checkout.cpu{env="prod", version=~"1\\..*"}"#);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use regex::{Regex, RegexBuilder};

use crate::series::{
    Cursor, NAME_LABEL, QuoteError, Series, is_app_char, is_app_name, is_label_char, is_label_name,
    write_quoted,
};

/// The most memory the regexes of one selector may take once compiled, in bytes: a parsed
/// selector with `n` regex matchers gives each `REGEX_SIZE_LIMIT / n`, so that repeating a costly
/// pattern does not multiply the cost (`\w{100}` is 8 bytes of query). The same figure caps each
/// regex's lazy DFA cache. [`Matcher::new`] gives its one regex the whole budget. Measured with `regex` 1.13 (the anchored form): a 1,000-way alternation of
/// 12-character values compiles to 0.6 MiB and a 5,000-way one to 2.7 MiB (the largest legitimate
/// patterns, built by UIs from a list of label values); Unicode classes are costly, `\w{100}` takes
/// 4.8 MiB; `(a{1000}){1000}` takes 31 MiB. 4 MiB admits the first two and refuses the last.
pub const REGEX_SIZE_LIMIT: usize = 4 << 20;

/// Why a selector could not be parsed or built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectorError {
    /// A character is not allowed where it appears.
    #[error("invalid character {found:?} in {context} at position {position}, expected {expected}")]
    InvalidCharacter {
        /// The character found.
        found: char,
        /// Its byte offset in the input.
        position: usize,
        /// The part of the selector being read.
        context: &'static str,
        /// What would have been accepted there.
        expected: &'static str,
    },
    /// The input ends inside the matchers.
    #[error("unexpected end of input in {context} at position {position}, expected {expected}")]
    UnexpectedEnd {
        /// The input's length.
        position: usize,
        /// The part of the selector being read.
        context: &'static str,
        /// What would have been accepted there.
        expected: &'static str,
    },
    /// There is no app name before the matchers, or the input is empty.
    #[error("missing app name at position {position}")]
    MissingAppName {
        /// Where the app name should start.
        position: usize,
    },
    /// A matcher has an operator but no label name, as in `{="x"}`.
    #[error("missing label name at position {position}")]
    MissingLabelName {
        /// Where the label name should start.
        position: usize,
    },
    /// A matcher names `__name__`; the app name goes before the braces instead.
    #[error(
        "label {NAME_LABEL:?} cannot be matched at position {position}, \
         put the app name before '{{' instead"
    )]
    ReservedLabelName {
        /// Where the name starts (0 for [`Matcher::new`]).
        position: usize,
    },
    /// A value is not double-quoted.
    #[error("label values must be double-quoted, found {found:?} at position {position}")]
    UnquotedValue {
        /// The character where the opening quote should be.
        found: char,
        /// Its byte offset in the input.
        position: usize,
    },
    /// A quoted value has no closing quote.
    #[error("unterminated quoted value starting at position {position}")]
    UnterminatedValue {
        /// Where the opening quote is.
        position: usize,
    },
    /// Something other than whitespace follows the closing `}`.
    #[error("unexpected character {found:?} after the matchers at position {position}")]
    TrailingCharacters {
        /// The first such character.
        found: char,
        /// Its byte offset in the input.
        position: usize,
    },
    /// The value of a `=~` or `!~` matcher is not a valid regex, or compiles to more than its
    /// share of [`REGEX_SIZE_LIMIT`].
    #[error("invalid regex in matcher {name}{op}{regex:?} at position {position}: {error}")]
    InvalidRegex {
        /// The matcher's label name.
        name: String,
        /// The matcher's operator.
        op: MatchOp,
        /// The pattern, unescaped.
        regex: String,
        /// Where the matcher starts (0 for [`Matcher::new`]).
        position: usize,
        /// What the regex compiler said.
        error: regex::Error,
    },
    /// [`Selector::new`] was given an app name that is empty or has a character outside
    /// `[A-Za-z0-9_.-]`.
    #[error("invalid app name {name:?}, expected one or more of a letter, digit, '_', '.' or '-'")]
    InvalidAppName {
        /// The name given.
        name: String,
    },
    /// [`Matcher::new`] was given a label name that is empty or has a character outside
    /// `[A-Za-z0-9_.]`.
    #[error("invalid label name {name:?}, expected one or more of a letter, digit, '_' or '.'")]
    InvalidLabelName {
        /// The name given.
        name: String,
    },
}

impl From<QuoteError> for SelectorError {
    fn from(err: QuoteError) -> SelectorError {
        match err {
            QuoteError::Unterminated { position } => SelectorError::UnterminatedValue { position },
        }
    }
}

/// How a matcher compares a label's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatchOp {
    /// `=`: the value equals.
    Equal,
    /// `!=`: the value differs.
    NotEqual,
    /// `=~`: the whole value matches the regex.
    Regex,
    /// `!~`: the whole value does not match the regex.
    NotRegex,
}

impl MatchOp {
    /// The operator as written in a query.
    pub fn as_str(self) -> &'static str {
        match self {
            MatchOp::Equal => "=",
            MatchOp::NotEqual => "!=",
            MatchOp::Regex => "=~",
            MatchOp::NotRegex => "!~",
        }
    }

    /// Whether the operator is a regex one.
    pub fn is_regex(self) -> bool {
        matches!(self, MatchOp::Regex | MatchOp::NotRegex)
    }
}

impl fmt::Display for MatchOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One `name op "value"` condition on a label.
#[derive(Clone, Debug)]
pub struct Matcher {
    name: String,
    op: MatchOp,
    value: String,
    /// The anchored regex, for the regex operators.
    regex: Option<Regex>,
}

impl Matcher {
    /// A matcher on label `name`. For the regex operators `value` is the pattern, unanchored as
    /// written; it is anchored when compiled.
    ///
    /// # Errors
    ///
    /// [`SelectorError::InvalidLabelName`] or [`SelectorError::ReservedLabelName`] for a bad
    /// name, [`SelectorError::InvalidRegex`] for a pattern that does not compile within
    /// [`REGEX_SIZE_LIMIT`]. Positions in these errors are 0.
    pub fn new(
        name: impl Into<String>,
        op: MatchOp,
        value: impl Into<String>,
    ) -> Result<Matcher, SelectorError> {
        let name = name.into();
        if name == NAME_LABEL {
            return Err(SelectorError::ReservedLabelName { position: 0 });
        }
        if !is_label_name(&name) {
            return Err(SelectorError::InvalidLabelName { name });
        }
        Matcher::build(name, op, value.into(), 0, REGEX_SIZE_LIMIT)
    }

    /// Compiles the regex if there is one, within `limit` bytes; `position` is where the matcher
    /// starts.
    fn build(
        name: String,
        op: MatchOp,
        value: String,
        position: usize,
        limit: usize,
    ) -> Result<Matcher, SelectorError> {
        let regex = if op.is_regex() {
            // Compile the pattern alone first: this rejects a pattern such as `a)|(b` that
            // would escape the anchoring group, and reports errors against what the user wrote.
            let compiled =
                compile(&value, limit).and_then(|_| compile(&format!("^(?:{value})$"), limit));
            match compiled {
                Ok(regex) => Some(regex),
                Err(error) => {
                    return Err(SelectorError::InvalidRegex {
                        name,
                        op,
                        regex: value,
                        position,
                        error,
                    });
                }
            }
        } else {
            None
        };
        Ok(Matcher {
            name,
            op,
            value,
            regex,
        })
    }

    /// The label name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The operator.
    pub fn op(&self) -> MatchOp {
        self.op
    }

    /// The value, or for the regex operators the pattern as written (unanchored).
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Whether a label value satisfies this matcher. Pass `""` for a missing label.
    pub fn matches(&self, value: &str) -> bool {
        // `build` compiles a regex for every regex operator, so `regex` is set for those.
        let regex_matches = || self.regex.as_ref().is_some_and(|r| r.is_match(value));
        match self.op {
            MatchOp::Equal => value == self.value,
            MatchOp::NotEqual => value != self.value,
            MatchOp::Regex => regex_matches(),
            MatchOp::NotRegex => !regex_matches(),
        }
    }
}

fn compile(pattern: &str, limit: usize) -> Result<Regex, regex::Error> {
    RegexBuilder::new(pattern)
        .size_limit(limit)
        .dfa_size_limit(limit)
        .build()
}

/// Matchers are equal when their names, operators and values are: the compiled regex follows.
impl PartialEq for Matcher {
    fn eq(&self, other: &Matcher) -> bool {
        self.name == other.name && self.op == other.op && self.value == other.value
    }
}

impl Eq for Matcher {}

impl Hash for Matcher {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.op.hash(state);
        self.value.hash(state);
    }
}

/// Writes `name op "value"`, escaping the value so that it reads back the same.
impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.name, self.op)?;
        write_quoted(f, &self.value)
    }
}

/// A FlameQL selector: an app name and matchers that must all hold.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Selector {
    app: String,
    matchers: Vec<Matcher>,
}

impl Selector {
    /// A selector for app `app` (such as `checkout.cpu`) with `matchers`, kept in order.
    ///
    /// # Errors
    ///
    /// [`SelectorError::InvalidAppName`] if `app` is empty or has a character outside
    /// `[A-Za-z0-9_.-]`.
    pub fn new(app: impl Into<String>, matchers: Vec<Matcher>) -> Result<Selector, SelectorError> {
        let app = app.into();
        if !is_app_name(&app) {
            return Err(SelectorError::InvalidAppName { name: app });
        }
        Ok(Selector { app, matchers })
    }

    /// Parses a FlameQL query such as `app.cpu{env="prod", version=~"1\\..*"}`; see the
    /// [module docs](self) for the syntax.
    ///
    /// # Errors
    ///
    /// A [`SelectorError`] naming the byte position of the first thing that is wrong and what
    /// was expected there, or the matcher whose regex does not compile.
    pub fn parse(input: &str) -> Result<Selector, SelectorError> {
        let mut cur = Cursor::new(input);
        cur.skip_whitespace();
        let app_start = cur.pos;
        let app = cur.take_while(is_app_char).to_owned();
        if app.is_empty() {
            return match cur.peek() {
                None | Some('{') => Err(SelectorError::MissingAppName {
                    position: app_start,
                }),
                Some(found) => Err(SelectorError::InvalidCharacter {
                    found,
                    position: app_start,
                    context: "app name",
                    expected: "a letter, digit, '_', '.' or '-'",
                }),
            };
        }
        cur.skip_whitespace();
        // Matchers are compiled after the whole query is read, when the number of regexes that
        // share the size budget is known.
        let mut parsed = Vec::new();
        match cur.peek() {
            None => {
                return Ok(Selector {
                    app,
                    matchers: Vec::new(),
                });
            }
            Some('{') => cur.bump(),
            Some(found) => {
                return Err(SelectorError::InvalidCharacter {
                    found,
                    position: cur.pos,
                    context: "app name",
                    expected: "a letter, digit, '_', '.', '-' or '{'",
                });
            }
        }
        loop {
            cur.skip_whitespace();
            let start = cur.pos;
            let name = cur.take_while(is_label_char);
            if name.is_empty() {
                match cur.peek() {
                    Some('}') => {
                        cur.bump();
                        break;
                    }
                    Some('=' | '!') => {
                        return Err(SelectorError::MissingLabelName { position: start });
                    }
                    Some(found) => {
                        return Err(SelectorError::InvalidCharacter {
                            found,
                            position: start,
                            context: "label name",
                            expected: "a letter, digit, '_', '.' or '}'",
                        });
                    }
                    None => {
                        return Err(unexpected_end(&cur, "matchers", "a label name or '}'"));
                    }
                }
            }
            if name == NAME_LABEL {
                return Err(SelectorError::ReservedLabelName { position: start });
            }
            cur.skip_whitespace();
            let op = if cur.eat("=~") {
                MatchOp::Regex
            } else if cur.eat("=") {
                MatchOp::Equal
            } else if cur.eat("!=") {
                MatchOp::NotEqual
            } else if cur.eat("!~") {
                MatchOp::NotRegex
            } else {
                let expected = "a letter, digit, '_', '.' or an operator (=, !=, =~, !~)";
                return Err(match cur.peek() {
                    // A lone `!` is the start of an operator: point at what follows it.
                    Some('!') => {
                        cur.bump();
                        match cur.peek() {
                            Some(found) => SelectorError::InvalidCharacter {
                                found,
                                position: cur.pos,
                                context: "operator",
                                expected: "'=' or '~' after '!'",
                            },
                            None => unexpected_end(&cur, "operator", "'=' or '~' after '!'"),
                        }
                    }
                    Some(found) => SelectorError::InvalidCharacter {
                        found,
                        position: cur.pos,
                        context: "label name",
                        expected,
                    },
                    None => unexpected_end(&cur, "label name", expected),
                });
            };
            cur.skip_whitespace();
            let value = match cur.peek() {
                Some('"') => cur.quoted()?,
                Some(found) => {
                    return Err(SelectorError::UnquotedValue {
                        found,
                        position: cur.pos,
                    });
                }
                None => return Err(unexpected_end(&cur, "matcher", "a double-quoted value")),
            };
            parsed.push((name.to_owned(), op, value, start));
            cur.skip_whitespace();
            match cur.peek() {
                Some(',') => cur.bump(),
                Some('}') => {
                    cur.bump();
                    break;
                }
                Some(found) => {
                    return Err(SelectorError::InvalidCharacter {
                        found,
                        position: cur.pos,
                        context: "matchers",
                        expected: "',' or '}' after a value",
                    });
                }
                None => return Err(unexpected_end(&cur, "matchers", "',' or '}'")),
            }
        }
        cur.skip_whitespace();
        if let Some(found) = cur.peek() {
            return Err(SelectorError::TrailingCharacters {
                found,
                position: cur.pos,
            });
        }
        let regexes = parsed.iter().filter(|(_, op, _, _)| op.is_regex()).count();
        let limit = REGEX_SIZE_LIMIT / regexes.max(1);
        let matchers = parsed
            .into_iter()
            .map(|(name, op, value, start)| Matcher::build(name, op, value, start, limit))
            .collect::<Result<_, _>>()?;
        Ok(Selector { app, matchers })
    }

    /// The app name, matched exactly.
    pub fn app(&self) -> &str {
        &self.app
    }

    /// The matchers, in query order.
    pub fn matchers(&self) -> &[Matcher] {
        &self.matchers
    }

    /// Whether `series` has this app name and satisfies every matcher, a missing label counting
    /// as the empty value.
    pub fn matches(&self, series: &Series) -> bool {
        series.app() == self.app
            && self
                .matchers
                .iter()
                .all(|m| m.matches(series.labels().get(&m.name).unwrap_or("")))
    }
}

fn unexpected_end(
    cur: &Cursor<'_>,
    context: &'static str,
    expected: &'static str,
) -> SelectorError {
    SelectorError::UnexpectedEnd {
        position: cur.pos,
        context,
        expected,
    }
}

impl FromStr for Selector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Selector, SelectorError> {
        Selector::parse(s)
    }
}

/// Writes `app{name="value", ...}` (`app{}` without matchers), which parses back to the same
/// selector.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{{", self.app)?;
        for (i, matcher) in self.matchers.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{matcher}")?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(input: &str) -> Selector {
        Selector::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"))
    }

    fn series(input: &str) -> Series {
        Series::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"))
    }

    fn err(input: &str) -> SelectorError {
        Selector::parse(input).expect_err(input)
    }

    #[test]
    fn parses_the_documented_example() {
        let s = sel(r#"app.cpu{env="staging", version=~"1.*"}"#);
        assert_eq!(s.app(), "app.cpu");
        assert_eq!(
            s.matchers(),
            [
                Matcher::new("env", MatchOp::Equal, "staging").unwrap(),
                Matcher::new("version", MatchOp::Regex, "1.*").unwrap(),
            ]
        );
        assert!(s.matches(&series("app.cpu{env=staging,version=1.2}")));
        assert!(!s.matches(&series("app.cpu{env=prod,version=1.2}")));
        assert!(!s.matches(&series("other.cpu{env=staging,version=1.2}")));
    }

    #[test]
    fn unescapes_values() {
        let s = sel(r#"app.cpu{version=~"1\\..*", q="say \"hi\"\n\t", p="C:\dir"}"#);
        assert_eq!(s.matchers()[0].value(), r"1\..*");
        assert_eq!(s.matchers()[1].value(), "say \"hi\"\n\t");
        assert_eq!(s.matchers()[2].value(), r"C:\dir");
        // Pyroscope v0 does not unescape: its form of the same regex means the same here.
        assert_eq!(sel(r#"a{v=~"1\..*"}"#).matchers()[0].value(), r"1\..*");
    }

    #[test]
    fn regexes_are_anchored() {
        let s = sel(r#"a{version=~"1.*"}"#);
        assert!(s.matches(&series("a{version=1.4}")));
        // Pyroscope v0 would match these: its regexes are unanchored.
        assert!(!s.matches(&series("a{version=21}")));
        assert!(!s.matches(&series("a{version=0.1}")));
        let s = sel(r#"a{env=~"prod|stage"}"#);
        assert!(s.matches(&series("a{env=stage}")));
        assert!(!s.matches(&series("a{env=production}")));
        let s = sel(r#"a{env!~"prod"}"#);
        assert!(s.matches(&series("a{env=production}")));
        assert!(!s.matches(&series("a{env=prod}")));
    }

    #[test]
    fn all_operators() {
        let s = series("a{env=prod,region=eu}");
        assert!(sel(r#"a{env="prod"}"#).matches(&s));
        assert!(!sel(r#"a{env!="prod"}"#).matches(&s));
        assert!(sel(r#"a{env=~"pr.d"}"#).matches(&s));
        assert!(!sel(r#"a{env!~"pr.d"}"#).matches(&s));
        assert!(sel(r#"a{env="prod",region!="us"}"#).matches(&s));
        assert!(!sel(r#"a{env="prod",region="us"}"#).matches(&s));
    }

    #[test]
    fn a_missing_label_is_the_empty_value() {
        let s = series("a{region=eu}");
        assert!(!sel(r#"a{env="prod"}"#).matches(&s));
        assert!(sel(r#"a{env!="prod"}"#).matches(&s));
        assert!(!sel(r#"a{env=~"p.*"}"#).matches(&s));
        assert!(sel(r#"a{env!~"p.*"}"#).matches(&s));
        // Where Prometheus semantics differ from Pyroscope v0's: patterns matching "".
        assert!(sel(r#"a{env=""}"#).matches(&s));
        assert!(sel(r#"a{env=~".*"}"#).matches(&s));
        assert!(!sel(r#"a{env!=""}"#).matches(&s));
        assert!(!sel(r#"a{env!~".*"}"#).matches(&s));
    }

    #[test]
    fn whitespace_commas_and_braces() {
        let expected = sel(r#"a{x="1",y="2"}"#);
        assert_eq!(sel(r#"  a { x = "1" ,  y=  "2" , } "#), expected);
        assert_eq!(sel("a"), sel("a{}"));
        assert_eq!(sel("a { }").matchers(), []);
        assert_eq!(sel(r#"a{x="1,2}",y="{"}"#).matchers()[0].value(), "1,2}");
    }

    #[test]
    fn display_round_trips() {
        for input in [
            r#"a.cpu{env="prod", version=~"1\\..*"}"#,
            r#"a{q="say \"hi\"\n\tC:\\x"}"#,
            "a{}",
        ] {
            let s = sel(input);
            assert_eq!(s.to_string(), input);
            assert_eq!(sel(&s.to_string()), s);
        }
        assert_eq!(sel("a").to_string(), "a{}");
    }

    #[test]
    fn reports_the_position_of_each_error() {
        assert_eq!(err(""), SelectorError::MissingAppName { position: 0 });
        assert_eq!(
            err(r#" {a="1"}"#),
            SelectorError::MissingAppName { position: 1 }
        );
        assert_eq!(
            err(r#"a{__name__="b"}"#),
            SelectorError::ReservedLabelName { position: 2 }
        );
        assert_eq!(
            err("a{env=prod}"),
            SelectorError::UnquotedValue {
                found: 'p',
                position: 6
            }
        );
        assert_eq!(
            err(r#"a{env="prod}"#),
            SelectorError::UnterminatedValue { position: 6 }
        );
        assert_eq!(
            err(r#"a{="x"}"#),
            SelectorError::MissingLabelName { position: 2 }
        );
        assert_eq!(
            err(r#"a{env<"x"}"#),
            SelectorError::InvalidCharacter {
                found: '<',
                position: 5,
                context: "label name",
                expected: "a letter, digit, '_', '.' or an operator (=, !=, =~, !~)",
            }
        );
        assert_eq!(
            err(r#"a{env!"x"}"#),
            SelectorError::InvalidCharacter {
                found: '"',
                position: 6,
                context: "operator",
                expected: "'=' or '~' after '!'",
            }
        );
        assert_eq!(
            err(r#"a{env="x" y="z"}"#),
            SelectorError::InvalidCharacter {
                found: 'y',
                position: 10,
                context: "matchers",
                expected: "',' or '}' after a value",
            }
        );
        assert_eq!(
            err(r#"a{env="x""#),
            SelectorError::UnexpectedEnd {
                position: 9,
                context: "matchers",
                expected: "',' or '}'",
            }
        );
        assert_eq!(
            err("a{env="),
            SelectorError::UnexpectedEnd {
                position: 6,
                context: "matcher",
                expected: "a double-quoted value",
            }
        );
        assert_eq!(
            err(r#"a{env="x"} y"#),
            SelectorError::TrailingCharacters {
                found: 'y',
                position: 11
            }
        );
        assert_eq!(
            err("a b"),
            SelectorError::InvalidCharacter {
                found: 'b',
                position: 2,
                context: "app name",
                expected: "a letter, digit, '_', '.', '-' or '{'",
            }
        );
        assert_eq!(
            err(r#"a{x="1",%="2"}"#),
            SelectorError::InvalidCharacter {
                found: '%',
                position: 8,
                context: "label name",
                expected: "a letter, digit, '_', '.' or '}'",
            }
        );
    }

    #[test]
    fn bad_regexes_name_the_matcher() {
        let e = err(r#"a{env="x", version=~"1.(*"}"#);
        assert!(
            matches!(&e, SelectorError::InvalidRegex { name, op: MatchOp::Regex, regex, position: 11, .. }
                if name == "version" && regex == "1.(*"),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with(r#"invalid regex in matcher version=~"1.(*" at position 11: "#)
        );
        // Unbalanced parentheses must not escape the anchoring group.
        assert!(matches!(
            err(r#"a{v=~"x)|(y"}"#),
            SelectorError::InvalidRegex { .. }
        ));
    }

    #[test]
    fn regex_size_is_capped() {
        let e = err(r#"a{v=~"(a{1000}){1000}"}"#);
        assert!(
            matches!(
                &e,
                SelectorError::InvalidRegex {
                    error: regex::Error::CompiledTooBig(_),
                    ..
                }
            ),
            "{e:?}"
        );
        // A long alternation of values, as a UI builds from a value list, still fits.
        let values: Vec<String> = (0..5000).map(|i| format!("service-{i:04}")).collect();
        let s = sel(&format!(r#"a{{svc=~"{}"}}"#, values.join("|")));
        assert!(s.matches(&series("a{svc=service-4999}")));
        assert!(!s.matches(&series("a{svc=service-5000}")));
        // The budget is shared: repeating a costly pattern does not multiply it. `\w{20}` takes
        // just under 1 MiB, so four fit and five do not.
        let repeated = |n: usize| {
            let m: Vec<String> = (0..n).map(|i| format!(r#"l{i}=~"\\w{{20}}""#)).collect();
            Selector::parse(&format!("a{{{}}}", m.join(",")))
        };
        assert!(repeated(4).is_ok());
        assert!(
            matches!(
                repeated(5),
                Err(SelectorError::InvalidRegex {
                    error: regex::Error::CompiledTooBig(_),
                    ..
                })
            ),
            "{:?}",
            repeated(5)
        );
    }

    #[test]
    fn constructors_validate() {
        assert_eq!(
            Matcher::new("__name__", MatchOp::Equal, "x"),
            Err(SelectorError::ReservedLabelName { position: 0 })
        );
        assert_eq!(
            Matcher::new("a b", MatchOp::Equal, "x"),
            Err(SelectorError::InvalidLabelName { name: "a b".into() })
        );
        assert_eq!(
            Selector::new("", vec![]),
            Err(SelectorError::InvalidAppName { name: "".into() })
        );
        let m = Matcher::new("env", MatchOp::NotRegex, "dev|test").unwrap();
        assert_eq!(m.to_string(), r#"env!~"dev|test""#);
        assert!(m.matches("prod") && !m.matches("dev"));
    }
}

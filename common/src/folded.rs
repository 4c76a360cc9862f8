//! The folded ("collapsed") text format, Pyroscope's default `/ingest` body, and its `lines`
//! variant: parse into a [`Tree`] and write a tree back out.
//!
//! Input is a request body as bytes; output is a [`Tree`] (fresh, or merged into an existing
//! one). The aggregator's `ingest` stage calls [`parse_folded_into`] once per body; tests, benches
//! and the query path's text export call [`write_folded`].
//!
//! A folded body holds one stack per line, root first, frames separated by `;`, and a count after
//! the **last** space, so frames may contain spaces:
//!
//! ```text
//! main;handler;json.Marshal 37
//! main;gc 5
//! ```
//!
//! The rules follow Pyroscope (`pkg/convert/parser.go:ParseGroups`) exactly, except where
//! Pyroscope loses data silently:
//!
//! - lines are split on `\n`; one trailing `\r` is stripped; empty lines are skipped;
//! - frames are split on `;`; empty frames are kept (`a;;b` has an empty middle frame, `;a` an
//!   empty root frame); one trailing `;` is ignored (`a;b;` is `a;b`, and `;` alone is one empty
//!   frame);
//! - the count is a base-10 unsigned integer (digits only); a count of 0 is accepted and adds
//!   nothing; duplicate stacks are summed;
//! - in the [`Lines`](FoldedFormat::Lines) format every non-empty line is a whole stack with a
//!   count of 1.
//!
//! Where Pyroscope drops the rest of a body after a 64 KiB line, skips lines without a count, and
//! wraps negative counts to huge values, this parser returns a [`FoldedError`] that names the
//! 1-based line. Parsing is all or nothing: on error no tree is returned and a tree passed to
//! [`parse_folded_into`] is left as it was.
//!
//! ```
//! use smolder_common::folded::{self, FoldedFormat, FoldedLimits};
//!
//! let body = b"main;handler;json.Marshal 37\nmain;gc 5\n";
//! let tree = folded::parse_folded(body, FoldedFormat::Folded, &FoldedLimits::default())?;
//! assert_eq!(tree.total(), 42);
//! assert_eq!(folded::to_folded(&tree), "main;gc 5\nmain;handler;json.Marshal 37\n");
//! # Ok::<(), smolder_common::FoldedError>(())
//! ```

use std::io;

use crate::tree::{FrameId, Tree};

/// The default [`FoldedLimits::max_line_bytes`]: 1 MiB.
///
/// Pyroscope's scanner stops at 64 KiB, which real JVM stacks exceed: async-profiler records up
/// to 2048 frames by default, and Spring or Kotlin-coroutine frames with package, class, lambda
/// and signature run to 150–300 bytes each, so a deep Java stack is 300–600 KiB of text. 1 MiB
/// fits those with room to spare while still bounding the work one line can ask for.
pub const DEFAULT_MAX_LINE_BYTES: usize = 1 << 20;

/// Longest count text quoted back in an error, so that a hostile line cannot make the error huge.
const MAX_QUOTED_COUNT: usize = 32;

/// Which text format a body is in; Pyroscope's `format` query parameter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FoldedFormat {
    /// `frame;frame;leaf count` per line; Pyroscope's default ("groups") when `format` is
    /// absent or unknown.
    #[default]
    Folded,
    /// `frame;frame;leaf` per line, each line one sample (`format=lines`).
    Lines,
}

/// Bounds on what one body may ask of the parser.
///
/// Build with struct update syntax so that new fields keep their defaults:
/// `FoldedLimits { max_line_bytes: 64 << 10, ..FoldedLimits::default() }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoldedLimits {
    /// The longest line accepted, in bytes, not counting its `\n`. Default
    /// [`DEFAULT_MAX_LINE_BYTES`] (1 MiB); a longer line is a [`FoldedError::LineTooLong`].
    pub max_line_bytes: usize,
}

impl Default for FoldedLimits {
    fn default() -> Self {
        FoldedLimits {
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
        }
    }
}

/// Why a folded or lines body was rejected. Every variant names the 1-based line at fault; the
/// whole body is rejected (the `/ingest` handler answers 422).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FoldedError {
    /// A line is longer than [`FoldedLimits::max_line_bytes`].
    #[error("line {line}: {len} bytes is longer than the limit of {limit} bytes")]
    LineTooLong {
        /// The 1-based line number.
        line: usize,
        /// The line's length in bytes, without its `\n`.
        len: usize,
        /// The limit in force.
        limit: usize,
    },
    /// A line holds bytes that are not UTF-8; frame names must be text.
    #[error("line {line}: invalid UTF-8 at byte {column}")]
    NotUtf8 {
        /// The 1-based line number.
        line: usize,
        /// The 1-based byte offset of the first invalid byte within the line.
        column: usize,
    },
    /// A folded line has no space, or nothing after its last space.
    #[error("line {line}: no count after the stack")]
    MissingCount {
        /// The 1-based line number.
        line: usize,
    },
    /// A folded line's count is negative (Pyroscope wraps these to huge values).
    #[error("line {line}: count {count:?} is negative")]
    NegativeCount {
        /// The 1-based line number.
        line: usize,
        /// The count as written, cut to 32 bytes.
        count: String,
    },
    /// A folded line's count is not a base-10 unsigned integer.
    #[error("line {line}: count {count:?} is not a base-10 unsigned integer")]
    InvalidCount {
        /// The 1-based line number.
        line: usize,
        /// The count as written, cut to 32 bytes.
        count: String,
    },
    /// A folded line's count does not fit in 64 bits.
    #[error("line {line}: count {count:?} does not fit in 64 bits")]
    CountOverflow {
        /// The 1-based line number.
        line: usize,
        /// The count as written, cut to 32 bytes.
        count: String,
    },
    /// A folded line has nothing before the space that precedes its count.
    #[error("line {line}: empty stack")]
    EmptyStack {
        /// The 1-based line number.
        line: usize,
    },
}

/// Parses `body` into a new tree.
///
/// # Errors
///
/// The first [`FoldedError`] in the body, by line. No tree is returned on error.
pub fn parse_folded(
    body: &[u8],
    format: FoldedFormat,
    limits: &FoldedLimits,
) -> Result<Tree, FoldedError> {
    let mut tree = Tree::new();
    let mut inserter = Inserter::new(&mut tree);
    scan(body, format, limits, |stack, count| {
        inserter.insert(stack, count)
    })?;
    Ok(tree)
}

/// Parses `body` and adds its stacks to `tree`, so that several bodies can be merged into one
/// tree (one `/ingest` time slot).
///
/// The body is checked in full before `tree` is touched, then inserted. Measured on a 10 MiB
/// corpus body into a 118 k-node tree (`benches/folded_parse.rs`, group `folded_parse_into`,
/// 2-vCPU EPYC VM): the validation pass takes 1.8 ms, validate-then-insert 21.7 ms, and parsing
/// into a temporary tree then merging it 23.9 ms, so validating first is the cheaper way to be
/// all or nothing.
///
/// # Errors
///
/// The first [`FoldedError`] in the body, by line. `tree` is unchanged on error.
pub fn parse_folded_into(
    tree: &mut Tree,
    body: &[u8],
    format: FoldedFormat,
    limits: &FoldedLimits,
) -> Result<(), FoldedError> {
    scan(body, format, limits, |_, _| {})?;
    let mut inserter = Inserter::new(tree);
    scan(body, format, limits, |stack, count| {
        inserter.insert(stack, count)
    })
}

/// Writes `tree` as folded text: one `root;...;leaf <self>` line per stack with a self value, in
/// the tree's deterministic order (children by byte-wise name), each line ending in `\n`.
///
/// Parsing the output gives back the same tree, with these exceptions, which folded text cannot
/// express:
///
/// - a `;` inside a frame name is written as `:` and a `\n` as a space, so that the frame stays
///   one frame on one line (`\r` and spaces need no change: the count follows the last space);
/// - the root's own self value (a sample with an empty stack, which no parser here produces) is
///   not written.
///
/// A stack whose leaf is the empty frame gets one extra trailing `;`, which the parser strips.
///
/// # Errors
///
/// Whatever `out` returns; output may be partial then.
pub fn write_folded<W: io::Write>(tree: &Tree, out: W) -> io::Result<()> {
    write_text(tree, out, FoldedFormat::Folded)
}

/// Writes `tree` in the `lines` format: each stack repeated once per unit of its self value.
///
/// Only for small trees (tests, fixtures): the output grows with the tree's total, not its size.
/// Frame names are written as by [`write_folded`], and a `\r` also becomes a space, since a line
/// ending in `\r` would lose it.
///
/// # Errors
///
/// Whatever `out` returns; output may be partial then.
pub fn write_lines<W: io::Write>(tree: &Tree, out: W) -> io::Result<()> {
    write_text(tree, out, FoldedFormat::Lines)
}

/// [`write_folded`] into a `String`.
pub fn to_folded(tree: &Tree) -> String {
    let mut out = Vec::with_capacity(tree.len() * 32);
    write_folded(tree, &mut out).expect("writing to a Vec cannot fail");
    String::from_utf8(out).expect("frame names are UTF-8 and replacements are ASCII")
}

/// [`write_lines`] into a `String`. Only for small trees.
pub fn to_lines(tree: &Tree) -> String {
    let mut out = Vec::new();
    write_lines(tree, &mut out).expect("writing to a Vec cannot fail");
    String::from_utf8(out).expect("frame names are UTF-8 and replacements are ASCII")
}

fn write_text<W: io::Write>(tree: &Tree, mut out: W, format: FoldedFormat) -> io::Result<()> {
    let mut line = Vec::with_capacity(256);
    let mut result = Ok(());
    tree.for_each_stack(|stack, value| {
        if result.is_err() || stack.is_empty() {
            return;
        }
        line.clear();
        for (i, &frame) in stack.iter().enumerate() {
            if i > 0 {
                line.push(b';');
            }
            push_frame(&mut line, tree.frames().name(frame), format);
        }
        if stack
            .last()
            .is_some_and(|&leaf| tree.frames().name(leaf).is_empty())
        {
            line.push(b';');
        }
        result = match format {
            FoldedFormat::Folded => {
                line.push(b' ');
                line.extend_from_slice(value.to_string().as_bytes());
                line.push(b'\n');
                out.write_all(&line)
            }
            FoldedFormat::Lines => {
                line.push(b'\n');
                (0..value).try_for_each(|_| out.write_all(&line))
            }
        };
    });
    result
}

/// Appends a frame name, replacing the bytes that would change the line's structure.
fn push_frame(line: &mut Vec<u8>, name: &str, format: FoldedFormat) {
    let special = |b: u8| b == b';' || b == b'\n' || (b == b'\r' && format == FoldedFormat::Lines);
    if !name.bytes().any(special) {
        line.extend_from_slice(name.as_bytes());
        return;
    }
    line.extend(name.bytes().map(|b| match b {
        b';' => b':',
        b if special(b) => b' ',
        b => b,
    }));
}

/// Walks the body line by line, checks every rule, and hands each stack (trailing `;` already
/// stripped) and its count to `sink`, stopping at the first error.
fn scan<'a>(
    body: &'a [u8],
    format: FoldedFormat,
    limits: &FoldedLimits,
    mut sink: impl FnMut(&'a str, u64),
) -> Result<(), FoldedError> {
    // One UTF-8 check over the whole body is faster than one per line; lines before the first
    // invalid byte are then sliced out of `text` without further checks.
    let (text, invalid_at) = match std::str::from_utf8(body) {
        Ok(text) => (text, usize::MAX),
        Err(e) => {
            let valid = e.valid_up_to();
            let text = std::str::from_utf8(&body[..valid]).expect("prefix checked valid");
            (text, valid)
        }
    };
    let mut start = 0;
    let mut number = 0;
    while start < body.len() {
        number += 1;
        let end = find_byte(b'\n', &body[start..]).map_or(body.len(), |i| start + i);
        let next = end + 1;
        if end - start > limits.max_line_bytes {
            return Err(FoldedError::LineTooLong {
                line: number,
                len: end - start,
                limit: limits.max_line_bytes,
            });
        }
        if invalid_at < end {
            return Err(FoldedError::NotUtf8 {
                line: number,
                column: invalid_at - start + 1,
            });
        }
        let raw = &text[start..end];
        start = next;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line.is_empty() {
            continue;
        }
        let (stack, count) = match format {
            FoldedFormat::Lines => (line, 1),
            FoldedFormat::Folded => {
                let space = line
                    .bytes()
                    .rposition(|b| b == b' ')
                    .ok_or(FoldedError::MissingCount { line: number })?;
                let count = parse_count(&line[space + 1..], number)?;
                if space == 0 {
                    return Err(FoldedError::EmptyStack { line: number });
                }
                (&line[..space], count)
            }
        };
        sink(stack.strip_suffix(';').unwrap_or(stack), count);
    }
    Ok(())
}

/// Parses a count: ASCII digits only, at most `u64::MAX`.
fn parse_count(text: &str, line: usize) -> Result<u64, FoldedError> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if text.is_empty() {
        return Err(FoldedError::MissingCount { line });
    }
    if !digits(text) {
        let count = quote(text);
        return Err(match text.strip_prefix('-') {
            Some(rest) if digits(rest) => FoldedError::NegativeCount { line, count },
            _ => FoldedError::InvalidCount { line, count },
        });
    }
    text.bytes().try_fold(0u64, |n, b| {
        n.checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
            .ok_or_else(|| FoldedError::CountOverflow {
                line,
                count: quote(text),
            })
    })
}

/// The count text for an error message, cut at a character boundary.
fn quote(text: &str) -> String {
    let mut end = text.len().min(MAX_QUOTED_COUNT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Position of the first `needle` in `haystack`, eight bytes at a time.
#[inline]
fn find_byte(needle: u8, haystack: &[u8]) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let pattern = LO * u64::from(needle);
    let mut chunks = haystack.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().expect("chunks_exact yields 8 bytes"));
        let x = word ^ pattern;
        // Classic "has zero byte": exact for the lowest matching byte, which is all we need.
        let found = x.wrapping_sub(LO) & !x & HI;
        if found != 0 {
            return Some(offset + (found.trailing_zeros() / 8) as usize);
        }
        offset += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == needle)
        .map(|i| offset + i)
}

/// Length of the common prefix of `a` and `b`, eight bytes at a time.
#[inline]
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let len = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= len {
        let x = u64::from_le_bytes(a[i..i + 8].try_into().expect("eight bytes"));
        let y = u64::from_le_bytes(b[i..i + 8].try_into().expect("eight bytes"));
        if x != y {
            return i + ((x ^ y).trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < len && a[i] == b[i] {
        i += 1;
    }
    i
}

/// Inserts stacks into a tree, reusing the frame ids of the previous stack's common prefix.
///
/// Folded bodies written from a tree (every SDK that aggregates first) are sorted, so neighbouring
/// lines share most of their frames; comparing bytes with the previous line is much cheaper than
/// hashing each shared frame again to intern it.
struct Inserter<'t, 'a> {
    tree: &'t mut Tree,
    /// The previous stack and, per frame, its id and the byte offset where it ends.
    previous: &'a str,
    ids: Vec<FrameId>,
    ends: Vec<usize>,
}

impl<'t, 'a> Inserter<'t, 'a> {
    fn new(tree: &'t mut Tree) -> Self {
        Inserter {
            tree,
            previous: "",
            ids: Vec::new(),
            ends: Vec::new(),
        }
    }

    fn insert(&mut self, stack: &'a str, count: u64) {
        if count == 0 {
            return;
        }
        let bytes = stack.as_bytes();
        let common = common_prefix(bytes, self.previous.as_bytes());
        // A frame of the previous stack is shared if it and its terminator (`;` or the end of
        // the stack) lie in the common prefix.
        let keep = self
            .ends
            .iter()
            .take_while(|&&end| end <= common && (end == bytes.len() || bytes[end] == b';'))
            .count();
        self.ids.truncate(keep);
        self.ends.truncate(keep);
        let done = self.ends.last().is_some_and(|&end| end == bytes.len());
        if !done {
            let mut from = self.ends.last().map_or(0, |&end| end + 1);
            loop {
                let to = find_byte(b';', &bytes[from..]).map_or(bytes.len(), |i| from + i);
                self.ids.push(self.tree.intern(&stack[from..to]));
                self.ends.push(to);
                if to == bytes.len() {
                    break;
                }
                from = to + 1;
            }
        }
        self.previous = stack;
        self.tree.insert(&self.ids, count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &[u8] = b"main;handler;json.Marshal 37\nmain;gc 5\n";

    fn folded(body: &[u8]) -> Result<Tree, FoldedError> {
        parse_folded(body, FoldedFormat::Folded, &FoldedLimits::default())
    }

    fn lines(body: &[u8]) -> Result<Tree, FoldedError> {
        parse_folded(body, FoldedFormat::Lines, &FoldedLimits::default())
    }

    /// The stacks of a tree as (frames, self), in the tree's order.
    fn stacks(tree: &Tree) -> Vec<(Vec<String>, u64)> {
        let mut out = Vec::new();
        tree.for_each_stack(|stack, value| {
            let names = stack.iter().map(|&f| tree.frames().name(f).to_string());
            out.push((names.collect(), value));
        });
        out
    }

    fn stack(frames: &[&str], value: u64) -> (Vec<String>, u64) {
        (frames.iter().map(|f| f.to_string()).collect(), value)
    }

    #[test]
    fn pyroscope_example_body() {
        let tree = folded(EXAMPLE).unwrap();
        assert_eq!(tree.total(), 42);
        assert_eq!(
            stacks(&tree),
            [
                stack(&["main", "gc"], 5),
                stack(&["main", "handler", "json.Marshal"], 37)
            ]
        );
        assert_eq!(
            to_folded(&tree),
            "main;gc 5\nmain;handler;json.Marshal 37\n"
        );
    }

    #[test]
    fn crlf_bodies_and_empty_lines() {
        let crlf = b"main;handler;json.Marshal 37\r\n\r\n\nmain;gc 5\r\n";
        assert_eq!(folded(crlf).unwrap(), folded(EXAMPLE).unwrap());
        assert_eq!(folded(b"a 1").unwrap().total(), 1, "no final newline");
        assert!(folded(b"\n\r\n\n").unwrap().is_empty());
        assert!(folded(b"").unwrap().is_empty());
    }

    #[test]
    fn the_last_space_splits_stack_from_count() {
        let tree = folded(b"main;Foo bar.baz(int x) 3\n").unwrap();
        assert_eq!(stacks(&tree), [stack(&["main", "Foo bar.baz(int x)"], 3)]);
        let tree = folded(b"a;b  2\n").unwrap();
        assert_eq!(stacks(&tree), [stack(&["a", "b "], 2)]);
    }

    #[test]
    fn empty_frames_are_kept_and_one_trailing_semicolon_is_ignored() {
        assert_eq!(
            stacks(&folded(b"a;;b 1").unwrap()),
            [stack(&["a", "", "b"], 1)]
        );
        assert_eq!(stacks(&folded(b";a 1").unwrap()), [stack(&["", "a"], 1)]);
        assert_eq!(folded(b"a;b; 1").unwrap(), folded(b"a;b 1").unwrap());
        assert_eq!(stacks(&folded(b"a;; 1").unwrap()), [stack(&["a", ""], 1)]);
        assert_eq!(stacks(&folded(b"; 1").unwrap()), [stack(&[""], 1)]);
    }

    #[test]
    fn duplicates_are_summed_and_zero_counts_add_nothing() {
        let tree = folded(b"a;b 2\nc 0\na;b 3\na 1\n").unwrap();
        assert_eq!(stacks(&tree), [stack(&["a"], 1), stack(&["a", "b"], 5)]);
        assert_eq!(tree.total(), 6);
        assert!(tree.frames().get("c").is_none(), "count 0 interns nothing");
        let max = format!("a {}\n", u64::MAX);
        assert_eq!(folded(max.as_bytes()).unwrap().total(), u64::MAX);
    }

    #[test]
    fn prefix_reuse_does_not_confuse_similar_stacks() {
        let body = b"a;bc;d 1\na;bc 2\na;b 4\na;bcd 8\na;bc;d;e 16\na;bc;d 32\nab 64\n";
        let tree = folded(body).unwrap();
        let mut expected = Tree::new();
        for (frames, value) in [
            (&["a", "bc", "d"][..], 33),
            (&["a", "bc"], 2),
            (&["a", "b"], 4),
            (&["a", "bcd"], 8),
            (&["a", "bc", "d", "e"], 16),
            (&["ab"], 64),
        ] {
            expected.insert_names(frames, value);
        }
        assert_eq!(tree, expected);
    }

    #[test]
    fn errors_name_their_line() {
        let cases: [(&[u8], FoldedError); 10] = [
            (b"a 1\nno_count\n", FoldedError::MissingCount { line: 2 }),
            (b"a 1\n\na \n", FoldedError::MissingCount { line: 3 }),
            (
                b"a -5\n",
                FoldedError::NegativeCount {
                    line: 1,
                    count: "-5".into(),
                },
            ),
            (
                b"a 1\nb 1.5\n",
                FoldedError::InvalidCount {
                    line: 2,
                    count: "1.5".into(),
                },
            ),
            (
                b"a +5",
                FoldedError::InvalidCount {
                    line: 1,
                    count: "+5".into(),
                },
            ),
            (
                b"a 1\r\nb 1x\r\n",
                FoldedError::InvalidCount {
                    line: 2,
                    count: "1x".into(),
                },
            ),
            (
                b"a 18446744073709551616\n",
                FoldedError::CountOverflow {
                    line: 1,
                    count: "18446744073709551616".into(),
                },
            ),
            (b"a 1\nb 1\n 5\n", FoldedError::EmptyStack { line: 3 }),
            (
                b"a 1\nb\xff 1\n",
                FoldedError::NotUtf8 { line: 2, column: 2 },
            ),
            (
                b"a 1\nb 1\n\xc3",
                FoldedError::NotUtf8 { line: 3, column: 1 },
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(folded(body).unwrap_err(), expected, "{body:?}");
        }
    }

    #[test]
    fn error_messages_are_lowercase_and_name_the_line() {
        let err = folded(b"a 1\nb -3\n").unwrap_err();
        assert_eq!(err.to_string(), "line 2: count \"-3\" is negative");
        let long = format!("a {}", "9".repeat(100));
        let FoldedError::CountOverflow { count, .. } = folded(long.as_bytes()).unwrap_err() else {
            panic!("expected an overflow");
        };
        assert_eq!(count.len(), MAX_QUOTED_COUNT);
    }

    #[test]
    fn the_first_error_wins() {
        assert_eq!(
            folded(b"a x\nb\xff 1\n").unwrap_err(),
            FoldedError::InvalidCount {
                line: 1,
                count: "x".into()
            }
        );
    }

    #[test]
    fn long_lines_follow_the_limit() {
        let frame = "com.example.service.Handler.handle(Lcom/example/Request;)V;";
        let mut line = frame.repeat(70 * 1024 / frame.len() + 1);
        line.push_str("leaf 1\n");
        assert!(line.len() > 70 * 1024);
        let tree = folded(line.as_bytes()).unwrap();
        assert_eq!(tree.total(), 1);

        let small = FoldedLimits {
            max_line_bytes: 64 << 10,
        };
        let body = format!("a 1\n{line}");
        let err = parse_folded(body.as_bytes(), FoldedFormat::Folded, &small).unwrap_err();
        assert_eq!(
            err,
            FoldedError::LineTooLong {
                line: 2,
                len: line.len() - 1,
                limit: 64 << 10,
            }
        );
    }

    #[test]
    fn lines_format_counts_each_line_once() {
        let tree = lines(b"main;gc\nmain;handler\r\n\nmain;gc\nmain;gc;\n").unwrap();
        assert_eq!(
            stacks(&tree),
            [stack(&["main", "gc"], 3), stack(&["main", "handler"], 1)]
        );
        assert_eq!(to_lines(&tree), "main;gc\nmain;gc\nmain;gc\nmain;handler\n");
        let spaces = lines(b"a b 5\n").unwrap();
        assert_eq!(stacks(&spaces), [stack(&["a b 5"], 1)]);
        assert!(matches!(
            lines(b"ok\n\xfe\n").unwrap_err(),
            FoldedError::NotUtf8 { line: 2, .. }
        ));
    }

    #[test]
    fn parse_into_merges_and_is_all_or_nothing() {
        let mut tree = folded(EXAMPLE).unwrap();
        parse_folded_into(
            &mut tree,
            b"main;gc 1\nother 2\n",
            FoldedFormat::Folded,
            &FoldedLimits::default(),
        )
        .unwrap();
        assert_eq!(tree.total(), 45);
        let before = tree.clone();
        let frames_before = tree.frames().len();
        let err = parse_folded_into(
            &mut tree,
            b"new;frames 1\nmain;gc 1\nbad\n",
            FoldedFormat::Folded,
            &FoldedLimits::default(),
        )
        .unwrap_err();
        assert_eq!(err, FoldedError::MissingCount { line: 3 });
        assert_eq!(tree, before);
        assert_eq!(tree.frames().len(), frames_before, "nothing interned");
    }

    #[test]
    fn emit_replaces_separators_and_keeps_empty_leaves() {
        let mut tree = Tree::new();
        tree.insert_names(["a;b", "c\nd", "e\rf"], 2);
        tree.insert_names(["x", ""], 1);
        tree.insert_names([""], 4);
        tree.insert(&[], 9);
        let text = to_folded(&tree);
        assert_eq!(text, "; 4\na:b;c d;e\rf 2\nx;; 1\n");
        let back = folded(text.as_bytes()).unwrap();
        assert_eq!(
            stacks(&back),
            [
                stack(&[""], 4),
                stack(&["a:b", "c d", "e\rf"], 2),
                stack(&["x", ""], 1)
            ]
        );
        let lines_text = to_lines(&tree);
        assert!(lines_text.starts_with(";\n;\n;\n;\na:b;c d;e f\n"));
    }

    #[test]
    fn find_byte_and_common_prefix_agree_with_the_obvious() {
        let text = b"0123456789abcdef;0123456789;xyz";
        for start in 0..text.len() {
            let slice = &text[start..];
            assert_eq!(
                find_byte(b';', slice),
                slice.iter().position(|&b| b == b';')
            );
        }
        assert_eq!(common_prefix(b"0123456789abc", b"0123456789abd"), 12);
        assert_eq!(common_prefix(b"01234567", b"01234567xyz"), 8);
        assert_eq!(common_prefix(b"", b"a"), 0);
        assert_eq!(common_prefix(b"abcdefghij", b"abcXefghij"), 3);
    }
}

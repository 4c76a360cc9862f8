//! Prometheus' text exposition format, parsed into samples, with lookups that fail loudly.
//!
//! A test that reads `smolder_agent_ship_connected` and gets 0 must be reading a gauge at 0,
//! not a metric that was renamed: [`Metrics::value`] panics, listing what there is, when no
//! sample matches. [`Metrics::find`] is the explicit way to ask for a sample that may not
//! exist yet (a labelled series before its first increment).

use std::collections::BTreeMap;
use std::fmt;

/// One sample line: `name{labels} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The metric name, with a histogram's `_bucket`, `_sum` or `_count` suffix.
    pub name: String,
    /// The labels, unescaped.
    pub labels: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

/// Why a text is not Prometheus' format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// The 1-based line.
    pub line: usize,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

impl std::error::Error for ParseError {}

/// Every sample of one exposition.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    samples: Vec<Sample>,
}

impl Metrics {
    /// Parses an exposition; comments (`# HELP`, `# TYPE`) and blank lines are skipped.
    ///
    /// # Errors
    ///
    /// A [`ParseError`] naming the first line that is not a sample.
    pub fn parse(text: &str) -> Result<Metrics, ParseError> {
        let mut samples = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            samples.push(parse_sample(line).map_err(|reason| ParseError {
                line: index + 1,
                reason,
            })?);
        }
        Ok(Metrics { samples })
    }

    /// `GET url` (a `/metrics` or `/exported-metrics` page), parsed.
    ///
    /// # Panics
    ///
    /// When the request fails, answers other than 200, or is not Prometheus' format.
    pub async fn scrape(url: &str) -> Metrics {
        let response = reqwest::get(url)
            .await
            .unwrap_or_else(|err| panic!("GET {url}: {err}"));
        assert!(
            response.status().is_success(),
            "GET {url}: {}",
            response.status()
        );
        let text = response
            .text()
            .await
            .unwrap_or_else(|err| panic!("GET {url}: {err}"));
        Metrics::parse(&text).unwrap_or_else(|err| panic!("GET {url}: {err}\n{text}"))
    }

    /// The sum of the samples of metric `name` that carry every one of `labels` (and any
    /// others): with no labels, of all its samples.
    ///
    /// # Panics
    ///
    /// When no sample matches: the message lists the metrics of a similar name, or the label
    /// sets `name` has.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels)
            .unwrap_or_else(|| panic!("{}", self.no_match(name, labels)))
    }

    /// The sum of the matching samples, as [`value`](Metrics::value), or `None` when no sample
    /// matches: for a series that may legitimately not exist yet.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut matching = self
            .samples_of(name)
            .filter(|sample| {
                labels
                    .iter()
                    .all(|(k, v)| sample.labels.get(*k).is_some_and(|have| have == v))
            })
            .peekable();
        matching.peek()?;
        Some(matching.map(|sample| sample.value).sum())
    }

    /// The samples of metric `name`.
    pub fn samples_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples
            .iter()
            .filter(move |sample| sample.name == name)
    }

    /// Every sample, in the order of the text.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    fn no_match(&self, name: &str, labels: &[(&str, &str)]) -> String {
        let sets: Vec<String> = self
            .samples_of(name)
            .map(|sample| format!("{:?}", sample.labels))
            .collect();
        if !sets.is_empty() {
            return format!(
                "metric {name} has no sample with labels {labels:?}; its samples have {}",
                sets.join(", ")
            );
        }
        // Names sharing the part before the last `_`-separated word, or that word.
        let stem = name.rsplit_once('_').map_or(name, |(stem, _)| stem);
        let mut similar: Vec<&str> = self
            .samples
            .iter()
            .map(|sample| sample.name.as_str())
            .filter(|other| other.starts_with(stem) || stem.starts_with(*other))
            .collect();
        similar.dedup();
        format!(
            "no metric {name} among {} samples (renamed?); similar names: {similar:?}",
            self.samples.len()
        )
    }
}

fn parse_sample(line: &str) -> Result<Sample, &'static str> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .ok_or("no value")?;
    let name = &line[..name_end];
    if name.is_empty() {
        return Err("no metric name");
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            rest = rest.trim_start_matches([' ', ',']);
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (label, after) = rest.split_once('=').ok_or("a label without '='")?;
            let after = after
                .strip_prefix('"')
                .ok_or("a label value without quotes")?;
            let (value, after) = unescape(after)?;
            labels.insert(label.trim().to_owned(), value);
            rest = after;
        }
    }
    let value = rest
        .split_whitespace()
        .next()
        .ok_or("no value")?
        .parse::<f64>()
        .map_err(|_| "a value that is not a number")?;
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// A label value up to its closing quote, unescaped, and what follows the quote.
fn unescape(text: &str) -> Result<(String, &str), &'static str> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((value, &text[i + 1..])),
            '\\' => match chars.next() {
                Some((_, 'n')) => value.push('\n'),
                Some((_, other)) => value.push(other),
                None => break,
            },
            other => value.push(other),
        }
    }
    Err("an unterminated label value")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP a_total Things.\n# TYPE a_total counter\n\
        a_total{stage=\"spool\",reason=\"full\"} 3\n\
        a_total{stage=\"spool\",reason=\"expired\"} 4\n\
        a_total{stage=\"ship\",reason=\"full\"} 5\n\
        quoted{v=\"a \\\"b\\\" \\\\ c\\n\"} 1.5\n\
        h_bucket{le=\"+Inf\"} 7\nh_sum 0.25\nh_count 7\ngauge 0\n";

    #[test]
    fn lookups_sum_what_matches() {
        let metrics = Metrics::parse(TEXT).unwrap();
        assert_eq!(metrics.value("a_total", &[]), 12.0);
        assert_eq!(metrics.value("a_total", &[("stage", "spool")]), 7.0);
        assert_eq!(
            metrics.value("a_total", &[("stage", "spool"), ("reason", "full")]),
            3.0
        );
        assert_eq!(metrics.value("quoted", &[("v", "a \"b\" \\ c\n")]), 1.5);
        assert_eq!(metrics.value("h_bucket", &[("le", "+Inf")]), 7.0);
        assert_eq!(metrics.value("gauge", &[]), 0.0);
        assert_eq!(metrics.find("a_total", &[("stage", "rules")]), None);
    }

    #[test]
    #[should_panic(
        expected = "no metric gauges among 8 samples (renamed?); similar names: [\"gauge\"]"
    )]
    fn a_missing_metric_fails_loudly() {
        Metrics::parse(TEXT).unwrap().value("gauges", &[]);
    }

    #[test]
    #[should_panic(expected = "metric a_total has no sample with labels [(\"stage\", \"rules\")]")]
    fn missing_labels_fail_loudly() {
        Metrics::parse(TEXT)
            .unwrap()
            .value("a_total", &[("stage", "rules")]);
    }

    #[test]
    fn malformed_lines_are_named() {
        assert_eq!(
            Metrics::parse("ok 1\nbad{x=1} 2\n").unwrap_err(),
            ParseError {
                line: 2,
                reason: "a label value without quotes"
            }
        );
        assert_eq!(
            Metrics::parse("x abc").unwrap_err().reason,
            "a value that is not a number"
        );
    }

    proptest::proptest! {
        #[test]
        fn any_text_parses_or_fails_without_panicking(text in "\\PC*") {
            let _ = Metrics::parse(&text);
        }
    }
}

//! What one batch may hold: the limits an aggregator announces in its [`Welcome`], why a series
//! is refused ([`RefusalReason`]), and the split of a window's series into batches within those
//! limits ([`split`]).
//!
//! Both tiers use the same checks: the aggregator refuses the series of a batch (or of an HTTP
//! request) that break its limits one by one and stores the rest; the agent checks its own
//! series against the limits it was told before it spools them, so that what it sends is
//! accepted whole, and splits a window too large for one batch into several.

use prost::Message;

use super::{RefusalTally, SeriesMessage, SeriesRefusal, Welcome};

/// The limits one batch must keep, as an aggregator announces them in its [`Welcome`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// The largest batch body, in bytes, both compressed and not (`ingest.quic.max-batch-bytes`).
    pub max_batch_bytes: u64,
    /// Most series in one batch (`ingest.max-series-per-request`).
    pub max_series: u32,
    /// Most labels one series may have (`ingest.max-labels-per-series`).
    pub max_labels: u32,
    /// Longest label name or value, in bytes (`ingest.max-label-bytes`).
    pub max_label_bytes: u32,
}

impl BatchLimits {
    /// The defaults of v0.1's aggregator, which announced only `max_batch_bytes`: what an agent
    /// assumes before its first welcome, and for what an older welcome leaves out.
    pub const V0_1: BatchLimits = BatchLimits {
        max_batch_bytes: 64 << 20,
        max_series: 10_000,
        max_labels: 30,
        max_label_bytes: 1024,
    };

    /// The limits `welcome` announces; those it leaves out (an aggregator of v0.1) are
    /// [`BatchLimits::V0_1`]'s.
    pub fn from_welcome(welcome: &Welcome) -> BatchLimits {
        let or = |announced: u32, default: u32| {
            if announced == 0 { default } else { announced }
        };
        BatchLimits {
            max_batch_bytes: if welcome.max_batch_bytes == 0 {
                Self::V0_1.max_batch_bytes
            } else {
                welcome.max_batch_bytes
            },
            max_series: or(welcome.max_series_per_batch, Self::V0_1.max_series),
            max_labels: or(welcome.max_labels_per_series, Self::V0_1.max_labels),
            max_label_bytes: or(welcome.max_label_bytes, Self::V0_1.max_label_bytes),
        }
    }

    /// Checks one series' labels, as `(name, value)` pairs, against the limits on their number
    /// and length.
    ///
    /// # Errors
    ///
    /// A [`Refusal`] of reason [`RefusalReason::TooManyLabels`] or
    /// [`RefusalReason::LabelTooLong`], naming the series (`app`) and the label.
    pub fn check_labels<'a>(
        &self,
        app: &str,
        labels: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    ) -> Result<(), Refusal> {
        let count = labels.len();
        if count > self.max_labels as usize {
            return Err(Refusal {
                reason: RefusalReason::TooManyLabels,
                message: format!(
                    "series {app} has {count} labels, more than ingest.max-labels-per-series ({})",
                    self.max_labels
                ),
            });
        }
        let max = self.max_label_bytes as usize;
        for (name, value) in labels {
            if name.len().max(value.len()) > max {
                return Err(Refusal {
                    reason: RefusalReason::LabelTooLong,
                    message: format!(
                        "label {:?} of series {app} is longer than ingest.max-label-bytes ({max})",
                        name.chars().take(64).collect::<String>(),
                    ),
                });
            }
        }
        Ok(())
    }

    /// How many bytes of encoded series one batch may carry: `max_batch_bytes` less room for the
    /// batch's own fields and for lz4's worst case, so that the frame is within the limit both
    /// before and after compression (an incompressible body grows by 1/255 plus 16 bytes).
    pub fn series_budget(&self) -> usize {
        let max = self.max_batch_bytes.min(u64::from(u32::MAX));
        let frame = max.saturating_sub(FRAME_SLACK) / 256 * 255;
        usize::try_from(frame.saturating_sub(IDENTITY_BYTES)).unwrap_or(usize::MAX)
    }
}

/// Bytes kept free in a batch for lz4's fixed overhead.
const FRAME_SLACK: u64 = 1024;
/// Bytes kept free in a batch for its identity fields: an agent id of at most
/// [`MAX_AGENT_ID_BYTES`](super::batch::MAX_AGENT_ID_BYTES) bytes, the sequence and the window.
const IDENTITY_BYTES: u64 = 256;

/// Why one series was not stored: a bounded set, the `reason` label of the dropped-series
/// counters on both tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefusalReason {
    /// The batch (or request) had more series than `ingest.max-series-per-request`; the series
    /// past it were refused.
    TooManySeries,
    /// More labels than `ingest.max-labels-per-series`.
    TooManyLabels,
    /// A label name or value longer than `ingest.max-label-bytes`.
    LabelTooLong,
    /// The tenant has as many active series as `ingest.max-active-series-per-tenant`, and this
    /// one is new.
    TenantSeriesLimit,
    /// The series' profile ended before the store's retention (`store.retention`).
    TooOld,
    /// The series' profile ends too far past the aggregator's clock.
    ClockSkew,
    /// One series alone is larger than a batch may be (`ingest.quic.max-batch-bytes`).
    TooLarge,
    /// The series does not decode: its name, labels, profile type, aggregation or tree is
    /// invalid.
    Invalid,
}

impl RefusalReason {
    /// Every reason, in a fixed order (for metrics that exist at zero from the start).
    pub const ALL: [RefusalReason; 8] = [
        RefusalReason::TooManySeries,
        RefusalReason::TooManyLabels,
        RefusalReason::LabelTooLong,
        RefusalReason::TenantSeriesLimit,
        RefusalReason::TooOld,
        RefusalReason::ClockSkew,
        RefusalReason::TooLarge,
        RefusalReason::Invalid,
    ];

    /// Its code, on the wire and in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::TooManySeries => "too_many_series",
            RefusalReason::TooManyLabels => "too_many_labels",
            RefusalReason::LabelTooLong => "label_too_long",
            RefusalReason::TenantSeriesLimit => "tenant_series_limit",
            RefusalReason::TooOld => "too_old",
            RefusalReason::ClockSkew => "clock_skew",
            RefusalReason::TooLarge => "too_large",
            RefusalReason::Invalid => "invalid",
        }
    }

    /// The reason of a code, or `None` for one this build does not know (a newer peer's).
    pub fn parse(code: &str) -> Option<RefusalReason> {
        RefusalReason::ALL
            .into_iter()
            .find(|reason| reason.as_str() == code)
    }
}

/// A series refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The bounded reason.
    pub reason: RefusalReason,
    /// What a human reads: the limit or the field at fault, with the series' name.
    pub message: String,
}

/// How many refusals an ack or reject lists one by one; the rest are counted per reason. With
/// [`MAX_MESSAGES`] of them carrying a message of at most [`MAX_MESSAGE_CHARS`], an answer
/// stays within [`FrameLimits::CONTROL`](super::FrameLimits::CONTROL), which agents of v0.1
/// read it under too.
pub const MAX_LISTED: usize = 256;
/// How many listed refusals carry their message.
pub const MAX_MESSAGES: usize = 16;
/// The longest message a listed refusal carries, in characters.
pub const MAX_MESSAGE_CHARS: usize = 512;

/// The refusals of a batch as an answer carries them: the first [`MAX_LISTED`] by index (the
/// first [`MAX_MESSAGES`] with their message), the rest counted per reason.
pub fn answer_refusals<'r>(
    refused: impl IntoIterator<Item = (usize, &'r Refusal)>,
) -> (Vec<SeriesRefusal>, Vec<RefusalTally>) {
    let mut listed = Vec::new();
    let mut tallies: Vec<RefusalTally> = Vec::new();
    for (index, refusal) in refused {
        if listed.len() < MAX_LISTED {
            let message = if listed.len() < MAX_MESSAGES {
                refusal.message.chars().take(MAX_MESSAGE_CHARS).collect()
            } else {
                String::new()
            };
            listed.push(SeriesRefusal {
                index: u32::try_from(index).unwrap_or(u32::MAX),
                reason: refusal.reason.as_str().to_owned(),
                message,
            });
            continue;
        }
        let code = refusal.reason.as_str();
        match tallies.iter_mut().find(|tally| tally.reason == code) {
            Some(tally) => tally.count = tally.count.saturating_add(1),
            None => tallies.push(RefusalTally {
                reason: code.to_owned(),
                count: 1,
            }),
        }
    }
    (listed, tallies)
}

/// How many series an answer refused, per reason (a code this build does not know, from a
/// newer aggregator, as `None`): the listed ones and the counted ones.
pub fn count_refusals(
    listed: &[SeriesRefusal],
    unlisted: &[RefusalTally],
) -> Vec<(Option<RefusalReason>, u64)> {
    let mut counts: Vec<(Option<RefusalReason>, u64)> = Vec::new();
    let mut add = |code: &str, n: u64| {
        let reason = RefusalReason::parse(code);
        match counts.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, count)) => *count += n,
            None => counts.push((reason, n)),
        }
    };
    for refusal in listed {
        add(&refusal.reason, 1);
    }
    for tally in unlisted {
        add(&tally.reason, u64::from(tally.count));
    }
    counts
}

/// A window's series split into batches within a [`BatchLimits`], and those no batch can carry.
#[derive(Debug, Default)]
pub struct Split {
    /// The batches' series, in the window's order; none is empty, each within the limits.
    pub batches: Vec<Vec<SeriesMessage>>,
    /// The series refused, each with why: labels over the limits, or larger alone than a batch.
    pub refused: Vec<(SeriesMessage, Refusal)>,
}

/// Splits `series` into as few batches as the limits allow, in order: a batch is closed when the
/// next series would take it past `max_series` or past [`BatchLimits::series_budget`] bytes.
/// Series whose labels break the limits, or that are larger alone than a batch may be, are
/// refused.
pub fn split(series: Vec<SeriesMessage>, limits: &BatchLimits) -> Split {
    let budget = limits.series_budget();
    let max_series = (limits.max_series as usize).max(1);
    let mut out = Split::default();
    let mut batch: Vec<SeriesMessage> = Vec::new();
    let mut batch_bytes = 0usize;
    for message in series {
        let labels = message
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()));
        if let Err(refusal) = limits.check_labels(&message.app, labels) {
            out.refused.push((message, refusal));
            continue;
        }
        // The series' bytes in the batch: its field key, its length and itself.
        let bytes = message.encoded_len();
        let bytes = bytes + prost::length_delimiter_len(bytes) + 1;
        if bytes > budget {
            let refusal = Refusal {
                reason: RefusalReason::TooLarge,
                message: format!(
                    "series {} takes {bytes} bytes, more than a batch may carry under ingest.quic.max-batch-bytes ({})",
                    message.app, limits.max_batch_bytes
                ),
            };
            out.refused.push((message, refusal));
            continue;
        }
        if !batch.is_empty() && (batch.len() == max_series || batch_bytes + bytes > budget) {
            out.batches.push(std::mem::take(&mut batch));
            batch_bytes = 0;
        }
        batch_bytes += bytes;
        batch.push(message);
    }
    if !batch.is_empty() {
        out.batches.push(batch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::LabelMessage;

    fn series(app: &str, labels: &[(&str, &str)], tree_bytes: usize) -> SeriesMessage {
        SeriesMessage {
            app: app.to_owned(),
            labels: labels
                .iter()
                .map(|(name, value)| LabelMessage {
                    name: (*name).to_owned(),
                    value: (*value).to_owned(),
                })
                .collect(),
            tree: vec![7; tree_bytes],
            ..SeriesMessage::default()
        }
    }

    #[test]
    fn a_welcome_of_v0_1_means_v0_1_defaults() {
        let old = Welcome {
            max_batch_bytes: 1 << 20,
            ..Welcome::default()
        };
        assert_eq!(
            BatchLimits::from_welcome(&old),
            BatchLimits {
                max_batch_bytes: 1 << 20,
                ..BatchLimits::V0_1
            }
        );
        let new = Welcome {
            max_batch_bytes: 1 << 20,
            max_series_per_batch: 5,
            max_labels_per_series: 2,
            max_label_bytes: 9,
            ..Welcome::default()
        };
        assert_eq!(
            BatchLimits::from_welcome(&new),
            BatchLimits {
                max_batch_bytes: 1 << 20,
                max_series: 5,
                max_labels: 2,
                max_label_bytes: 9,
            }
        );
    }

    #[test]
    fn windows_split_by_series_count_and_bytes_and_bad_series_are_refused() {
        let limits = BatchLimits {
            max_batch_bytes: 4096,
            max_series: 3,
            max_labels: 1,
            max_label_bytes: 8,
        };
        let budget = limits.series_budget();
        assert!(budget > 2_000 && budget < 4096, "{budget}");
        let input = vec![
            series("a.cpu", &[], 10),
            series("b.cpu", &[("x", "1"), ("y", "2")], 10),
            series("c.cpu", &[("name", "far-too-long")], 10),
            series("d.cpu", &[], 10),
            series("e.cpu", &[], 10),
            series("f.cpu", &[], 10),
            series("g.cpu", &[], budget),
            series("h.cpu", &[], budget / 2),
            series("i.cpu", &[], budget / 2),
        ];
        let split = split(input, &limits);
        let names: Vec<Vec<&str>> = split
            .batches
            .iter()
            .map(|batch| batch.iter().map(|s| s.app.as_str()).collect())
            .collect();
        assert_eq!(
            names,
            [
                vec!["a.cpu", "d.cpu", "e.cpu"],
                vec!["f.cpu", "h.cpu"],
                vec!["i.cpu"]
            ]
        );
        let refused: Vec<(&str, RefusalReason)> = split
            .refused
            .iter()
            .map(|(s, r)| (s.app.as_str(), r.reason))
            .collect();
        assert_eq!(
            refused,
            [
                ("b.cpu", RefusalReason::TooManyLabels),
                ("c.cpu", RefusalReason::LabelTooLong),
                ("g.cpu", RefusalReason::TooLarge),
            ]
        );
        assert!(
            split.refused[1]
                .1
                .message
                .contains("ingest.max-label-bytes")
        );
    }

    #[test]
    fn answers_list_the_first_refusals_and_count_the_rest() {
        let refusals: Vec<(usize, Refusal)> = (0..1_000)
            .map(|i| {
                let reason = if i % 2 == 0 {
                    RefusalReason::TenantSeriesLimit
                } else {
                    RefusalReason::LabelTooLong
                };
                let message = "x".repeat(2_000);
                (i * 3, Refusal { reason, message })
            })
            .collect();
        let (listed, unlisted) = answer_refusals(refusals.iter().map(|(i, r)| (*i, r)));
        assert_eq!(listed.len(), MAX_LISTED);
        assert_eq!(listed[5].index, 15);
        assert_eq!(listed[0].message.len(), MAX_MESSAGE_CHARS);
        assert!(listed[MAX_MESSAGES].message.is_empty());
        let ack = crate::wire::Ack {
            sequence: 1,
            duplicate: false,
            refused: listed.clone(),
            unlisted: unlisted.clone(),
        };
        let frame = crate::wire::frame::encode(crate::wire::FrameKind::Ack, &ack);
        let back: crate::wire::Ack = crate::wire::frame::decode(
            &frame,
            crate::wire::FrameKind::Ack,
            crate::wire::FrameLimits::CONTROL,
        )
        .expect("within the control frame's limits");
        assert!(ack.encoded_len() < 64 << 10);
        let mut counts = count_refusals(&back.refused, &back.unlisted);
        counts.sort_by_key(|(reason, _)| reason.map(RefusalReason::as_str));
        assert_eq!(
            counts,
            [
                (Some(RefusalReason::LabelTooLong), 500),
                (Some(RefusalReason::TenantSeriesLimit), 500)
            ]
        );
        let unknown = SeriesRefusal {
            index: 0,
            reason: "newer".to_owned(),
            message: String::new(),
        };
        assert_eq!(count_refusals(&[unknown], &[]), [(None, 1)]);
    }

    #[test]
    fn codes_round_trip_and_unknown_codes_are_none() {
        for reason in RefusalReason::ALL {
            assert_eq!(RefusalReason::parse(reason.as_str()), Some(reason));
        }
        assert_eq!(RefusalReason::parse("from_the_future"), None);
    }
}

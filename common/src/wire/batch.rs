//! A window's profiles as a [`BatchMessage`], and back, checking everything that came over
//! the wire.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{BatchMessage, LabelMessage, SeriesMessage};
use crate::{Aggregation, DecodeError, Labels, Profile, ProfileMeta, Series, SeriesError, Tree};

/// The longest agent id accepted, in bytes: ids are generated as 32 hex digits, and an id is
/// part of every dedupe key the aggregator keeps.
pub const MAX_AGENT_ID_BYTES: usize = 128;

/// Why a decoded batch does not make valid profiles.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// The agent id is empty, too long, or not printable ASCII.
    #[error(
        "invalid agent id {agent_id:?}: expected 1 to {MAX_AGENT_ID_BYTES} printable ASCII characters"
    )]
    BadAgentId {
        /// The id as sent, cut to 64 characters.
        agent_id: String,
    },
    /// The sequence number is 0; agents number batches from 1.
    #[error("sequence number 0 is invalid; batches are numbered from 1")]
    ZeroSequence,
    /// The window's end is before its start, or either is before the epoch.
    #[error("invalid window: start {start} ns, end {end} ns")]
    BadWindow {
        /// Start as sent, nanoseconds since the epoch.
        start: i64,
        /// End as sent, nanoseconds since the epoch.
        end: i64,
    },
    /// A series' app name or labels are not valid.
    #[error("series {index} ({app:?}): {source}")]
    BadSeries {
        /// The series' index in the batch.
        index: usize,
        /// Its app name as sent.
        app: String,
        /// What is wrong.
        source: SeriesError,
    },
    /// A series' `profile_type` disagrees with its app name.
    #[error("series {index} ({app:?}): profile type {profile_type:?} does not match the app name")]
    ProfileTypeMismatch {
        /// The series' index in the batch.
        index: usize,
        /// Its app name as sent.
        app: String,
        /// The profile type as sent.
        profile_type: String,
    },
    /// A series' aggregation is neither `sum` nor `average`.
    #[error("series {index} ({app:?}): unknown aggregation {aggregation:?}")]
    BadAggregation {
        /// The series' index in the batch.
        index: usize,
        /// Its app name as sent.
        app: String,
        /// The aggregation as sent.
        aggregation: String,
    },
    /// A series' tree does not decode.
    #[error("series {index} ({app:?}): invalid tree")]
    BadTree {
        /// The series' index in the batch.
        index: usize,
        /// Its app name as sent.
        app: String,
        /// What the tree decoder said.
        #[source]
        source: DecodeError,
    },
}

fn unix_nanos(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Checks an agent id as sent in a hello or a batch.
///
/// # Errors
///
/// [`BatchError::BadAgentId`] when it is empty, longer than [`MAX_AGENT_ID_BYTES`] or holds
/// anything but printable ASCII.
pub fn check_agent_id(id: &str) -> Result<(), BatchError> {
    if id.is_empty() || id.len() > MAX_AGENT_ID_BYTES || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(BatchError::BadAgentId {
            agent_id: id.chars().take(64).collect(),
        });
    }
    Ok(())
}

impl SeriesMessage {
    /// One profile's series, meta and encoded tree.
    pub fn from_profile(profile: &Profile) -> SeriesMessage {
        SeriesMessage {
            app: profile.series.app().to_owned(),
            profile_type: profile.series.profile_type().unwrap_or_default().to_owned(),
            labels: profile
                .series
                .labels()
                .iter()
                .map(|(name, value)| LabelMessage {
                    name: name.to_owned(),
                    value: value.to_owned(),
                })
                .collect(),
            units: profile.meta.units.clone(),
            sample_rate: profile.meta.sample_rate,
            spy_name: profile.meta.spy_name.clone(),
            aggregation: profile.meta.aggregation.as_str().to_owned(),
            tree: profile.tree.encode(),
        }
    }

    /// The series as a profile spanning `from` to `until`, after checking every field; `index`
    /// is its place in the batch, for the error.
    ///
    /// # Errors
    ///
    /// A [`BatchError`] naming the series and what is wrong with it.
    pub fn into_profile(
        self,
        index: usize,
        from: SystemTime,
        until: SystemTime,
    ) -> Result<Profile, BatchError> {
        let SeriesMessage {
            app,
            profile_type,
            labels,
            units,
            sample_rate,
            spy_name,
            aggregation,
            tree,
        } = self;
        let bad = |source| BatchError::BadSeries {
            index,
            app: app.clone(),
            source,
        };
        let labels =
            Labels::from_pairs(labels.into_iter().map(|l| (l.name, l.value))).map_err(bad)?;
        let series = Series::new(app.clone(), labels).map_err(bad)?;
        if series.profile_type().unwrap_or_default() != profile_type {
            return Err(BatchError::ProfileTypeMismatch {
                index,
                app,
                profile_type,
            });
        }
        let aggregation: Aggregation =
            aggregation
                .parse()
                .map_err(|_| BatchError::BadAggregation {
                    index,
                    app: app.clone(),
                    aggregation: aggregation.clone(),
                })?;
        let tree = Tree::decode(&tree).map_err(|source| BatchError::BadTree {
            index,
            app: app.clone(),
            source,
        })?;
        Ok(Profile {
            series,
            meta: ProfileMeta {
                spy_name,
                sample_rate,
                units,
                aggregation,
            },
            from,
            until,
            tree,
        })
    }
}

impl BatchMessage {
    /// The batch of one window: each profile's series, meta and encoded tree. Profiles are
    /// taken to span the window, as the agent's windows make them.
    pub fn from_profiles(
        agent_id: &str,
        sequence: u64,
        start: SystemTime,
        end: SystemTime,
        profiles: &[Profile],
    ) -> BatchMessage {
        BatchMessage::from_series(
            agent_id,
            sequence,
            start,
            end,
            profiles.iter().map(SeriesMessage::from_profile).collect(),
        )
    }

    /// The batch of `series` over one window.
    pub fn from_series(
        agent_id: &str,
        sequence: u64,
        start: SystemTime,
        end: SystemTime,
        series: Vec<SeriesMessage>,
    ) -> BatchMessage {
        BatchMessage {
            agent_id: agent_id.to_owned(),
            sequence,
            start_unix_nanos: unix_nanos(start),
            end_unix_nanos: unix_nanos(end),
            series,
        }
    }

    /// Checks the batch's identity fields: agent id, sequence and window.
    ///
    /// # Errors
    ///
    /// [`BatchError::BadAgentId`], [`BatchError::ZeroSequence`] or [`BatchError::BadWindow`].
    pub fn check_identity(&self) -> Result<(), BatchError> {
        check_agent_id(&self.agent_id)?;
        if self.sequence == 0 {
            return Err(BatchError::ZeroSequence);
        }
        if self.start_unix_nanos < 0 || self.end_unix_nanos < self.start_unix_nanos {
            return Err(BatchError::BadWindow {
                start: self.start_unix_nanos,
                end: self.end_unix_nanos,
            });
        }
        Ok(())
    }

    /// The window's start and end.
    pub fn window(&self) -> (SystemTime, SystemTime) {
        let at = |nanos: i64| UNIX_EPOCH + Duration::from_nanos(u64::try_from(nanos).unwrap_or(0));
        (at(self.start_unix_nanos), at(self.end_unix_nanos))
    }

    /// The batch's series, each a profile spanning the window or the error that refuses it
    /// alone, after checking the batch's identity.
    ///
    /// # Errors
    ///
    /// [`BatchError::BadAgentId`], [`BatchError::ZeroSequence`] or [`BatchError::BadWindow`]:
    /// nothing of a batch with a bad identity is read.
    pub fn into_series(self) -> Result<Vec<Result<Profile, BatchError>>, BatchError> {
        self.check_identity()?;
        let (from, until) = self.window();
        Ok(self
            .series
            .into_iter()
            .enumerate()
            .map(|(index, series)| series.into_profile(index, from, until))
            .collect())
    }

    /// The batch's profiles, each spanning the window, after checking every field.
    ///
    /// # Errors
    ///
    /// A [`BatchError`] naming the series and what is wrong with it; nothing is returned of a
    /// batch with any invalid part.
    pub fn into_profiles(self) -> Result<Vec<Profile>, BatchError> {
        self.into_series()?.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(name: &str, stacks: &[(&str, u64)]) -> Profile {
        let mut tree = Tree::new();
        for (stack, value) in stacks {
            tree.insert_names(stack.split(';'), *value);
        }
        Profile {
            series: name.parse().unwrap(),
            meta: ProfileMeta {
                spy_name: "ebpfspy".into(),
                sample_rate: 99,
                units: "samples".into(),
                aggregation: Aggregation::Sum,
            },
            from: UNIX_EPOCH + Duration::from_secs(100),
            until: UNIX_EPOCH + Duration::from_secs(110),
            tree,
        }
    }

    #[test]
    fn profiles_round_trip() {
        let profiles = vec![
            profile(
                "checkout.cpu{env=prod,host=a}",
                &[("main;work", 3), ("main", 1)],
            ),
            profile("db.alloc_space{}", &[("malloc", 4096)]),
        ];
        let start = UNIX_EPOCH + Duration::from_secs(100);
        let end = UNIX_EPOCH + Duration::from_secs(110);
        let message = BatchMessage::from_profiles("agent-1", 7, start, end, &profiles);
        assert_eq!(message.series[0].profile_type, "cpu");
        let back = message.into_profiles().unwrap();
        assert_eq!(back.len(), 2);
        for (a, b) in profiles.iter().zip(&back) {
            assert_eq!(a.series, b.series);
            assert_eq!(a.meta, b.meta);
            assert_eq!(a.tree.encode(), b.tree.encode());
            assert_eq!((b.from, b.until), (start, end));
        }
    }

    #[test]
    fn invalid_parts_are_named() {
        let start = UNIX_EPOCH + Duration::from_secs(100);
        let good = BatchMessage::from_profiles(
            "agent-1",
            1,
            start,
            start + Duration::from_secs(10),
            &[profile("a.cpu", &[("x", 1)])],
        );
        let mut m = good.clone();
        m.series[0].tree = vec![1, 2, 3];
        let err = m.into_profiles().unwrap_err();
        assert!(
            err.to_string()
                .starts_with("series 0 (\"a.cpu\"): invalid tree"),
            "{err}"
        );
        let mut m = good.clone();
        m.series[0].profile_type = "wall".into();
        assert!(matches!(
            m.into_profiles(),
            Err(BatchError::ProfileTypeMismatch { .. })
        ));
        let mut m = good.clone();
        m.agent_id = "bad id".into();
        assert!(matches!(
            m.into_profiles(),
            Err(BatchError::BadAgentId { .. })
        ));
        let mut m = good.clone();
        m.sequence = 0;
        assert!(matches!(m.into_profiles(), Err(BatchError::ZeroSequence)));
        let mut m = good.clone();
        m.end_unix_nanos = m.start_unix_nanos - 1;
        assert!(matches!(
            m.into_profiles(),
            Err(BatchError::BadWindow { .. })
        ));
        let mut m = good;
        m.series[0].labels.push(LabelMessage {
            name: "bad name".into(),
            value: "v".into(),
        });
        assert!(matches!(
            m.into_profiles(),
            Err(BatchError::BadSeries { .. })
        ));
    }

    #[test]
    fn one_bad_series_is_refused_alone() {
        let start = UNIX_EPOCH + Duration::from_secs(100);
        let mut message = BatchMessage::from_profiles(
            "agent-1",
            1,
            start,
            start + Duration::from_secs(10),
            &[
                profile("a.cpu", &[("x", 1)]),
                profile("b.cpu", &[("y", 2)]),
                profile("c.cpu", &[("z", 3)]),
            ],
        );
        message.series[1].tree = vec![1, 2, 3];
        let series = message.clone().into_series().unwrap();
        assert_eq!(series.len(), 3);
        assert!(series[0].is_ok() && series[2].is_ok());
        assert!(
            matches!(&series[1], Err(BatchError::BadTree { index: 1, .. })),
            "{:?}",
            series[1]
        );
        assert!(message.clone().into_profiles().is_err(), "all or nothing");
        message.sequence = 0;
        assert!(matches!(
            message.into_series(),
            Err(BatchError::ZeroSequence)
        ));
    }
}

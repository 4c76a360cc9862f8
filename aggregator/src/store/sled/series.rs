//! The series record: what the sled backend keeps about a series besides its data.

use serde::{Deserialize, Serialize};
use smolder_common::{Aggregation, Labels, ProfileMeta, Series};

use super::keys;
use crate::store::plan::BUCKET;
use crate::store::{SeriesInfo, StoreError};

/// One series, as stored under `S<id>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SeriesRecord {
    /// The normalized key (`app{k=v}`), as indexed under `K`.
    pub(crate) key: String,
    pub(crate) app: String,
    pub(crate) labels: Vec<(String, String)>,
    pub(crate) spy_name: String,
    pub(crate) sample_rate: u32,
    pub(crate) units: String,
    pub(crate) aggregation: String,
    pub(crate) first_seen: u64,
    pub(crate) last_seen: u64,
}

impl SeriesRecord {
    pub(crate) fn new(series: &Series, meta: &ProfileMeta, bucket: u64) -> Self {
        let mut record = SeriesRecord {
            key: series.to_string(),
            app: series.app().to_owned(),
            labels: series
                .labels()
                .iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            spy_name: String::new(),
            sample_rate: 0,
            units: String::new(),
            aggregation: String::new(),
            first_seen: bucket,
            last_seen: bucket,
        };
        record.update(meta, bucket);
        record
    }

    /// Takes the metadata of the latest write (Pyroscope keeps the last one too) and widens the
    /// seen range to `bucket`.
    pub(crate) fn update(&mut self, meta: &ProfileMeta, bucket: u64) {
        self.spy_name.clone_from(&meta.spy_name);
        self.sample_rate = meta.sample_rate;
        self.units.clone_from(&meta.units);
        self.aggregation = meta.aggregation.as_str().to_owned();
        self.first_seen = self.first_seen.min(bucket);
        self.last_seen = self.last_seen.max(bucket);
    }

    /// Every label of the series, with the app name as `__name__`, for the index.
    pub(crate) fn index_entries(&self) -> impl Iterator<Item = (&str, &str)> {
        std::iter::once((smolder_common::series::NAME_LABEL, self.app.as_str()))
            .chain(self.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        keys::seal(&serde_json::to_vec(self).expect("a series record serializes"))
    }

    pub(crate) fn decode(key: &[u8], value: &[u8]) -> Result<Self, StoreError> {
        let payload = keys::open(key, value)?;
        serde_json::from_slice(payload).map_err(|_| StoreError::Corrupt {
            key: keys::printable(key),
            reason: "malformed series record",
        })
    }

    pub(crate) fn meta(&self) -> ProfileMeta {
        ProfileMeta {
            spy_name: self.spy_name.clone(),
            sample_rate: self.sample_rate,
            units: self.units.clone(),
            aggregation: self.aggregation.parse().unwrap_or(Aggregation::Sum),
        }
    }

    /// The series as the store's interface shows it; `key` names the record in an error.
    pub(crate) fn info(&self, key: &[u8]) -> Result<SeriesInfo, StoreError> {
        let corrupt = || StoreError::Corrupt {
            key: keys::printable(key),
            reason: "series record does not form a valid series",
        };
        let labels = Labels::from_pairs(self.labels.iter().cloned()).map_err(|_| corrupt())?;
        let series = Series::new(self.app.clone(), labels).map_err(|_| corrupt())?;
        Ok(SeriesInfo {
            series,
            meta: self.meta(),
            first_seen: self.first_seen,
            last_seen: self.last_seen,
        })
    }

    /// Whether the series has data in `[from, until)` (unix seconds).
    pub(crate) fn overlaps(&self, from: u64, until: u64) -> bool {
        self.first_seen < until && self.last_seen + BUCKET > from
    }
}

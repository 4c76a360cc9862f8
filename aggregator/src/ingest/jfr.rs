//! JFR bodies: `format=jfr`, as the Pyroscope Java agent sends by default.
//!
//! Input: checked [`IngestParams`] and the body read under the caps. The agent
//! (`grafana/pyroscope-java`, `PyroscopeExporter`) sends a multipart form: field `jfr` (the
//! gzipped recording from async-profiler) and, optionally, field `labels` (a gzipped
//! `LabelsSnapshot` protobuf of the contextual labels set with `Pyroscope.LabelsWrapper`).
//! A bare body (not multipart) is the recording itself. Parts and bare bodies are gunzipped
//! when they start with the gzip magic, within the request's decompression budget.
//!
//! Output: a [`ProfileSet`] with one profile per profile type the recording has samples for
//! ([`smolder_common::jfr`] lists them), named `<name's app>.<suffix>{name's labels}`, with the
//! type's units, summed, the sample rate from `sampleRate`.
//!
//! Not yet read: the `labels` field. Samples are stored under the `name` labels only, as if
//! no contextual labels had been set; the field is accepted and ignored so that the agent's
//! uploads are not rejected for it.

use axum::body::Bytes;
use axum::http::request::Parts;
use smolder_common::{ProfileSeries, jfr};

use super::body::{FormFields, RequestBody};
use super::params::IngestParams;
use super::pprof::{Converted, to_profiles};
use super::{IngestError, ProfileSet};

/// Reads the agent's form from `body` (read under the caps) and returns the `jfr` field. Of a
/// repeated field the first wins.
///
/// # Errors
///
/// [`IngestError::Multipart`] for a malformed form and [`IngestError::MissingJfrField`] when
/// no field is named `jfr`.
pub(crate) async fn read_form(parts: Parts, body: Bytes) -> Result<Bytes, IngestError> {
    let mut form = FormFields::read(parts, body).await?;
    form.take("jfr")
        .ok_or_else(|| IngestError::MissingJfrField {
            fields: form.sent(),
        })
}

/// Converts a recording (gzipped or not) of the request `body` to profiles.
///
/// # Errors
///
/// [`IngestError::BadGzip`] or [`IngestError::DecompressedTooLarge`] for a gzipped recording
/// that does not inflate within the request's budget, [`IngestError::Jfr`] for one that does
/// not parse, and [`IngestError::BadProfileName`] when a suffix makes an invalid app name.
pub(crate) fn parse(
    params: &IngestParams,
    recording: &[u8],
    part: &'static str,
    body: &RequestBody,
) -> Result<ProfileSet, IngestError> {
    let recording = body.inflate.gunzip_part(recording, part)?;
    let converted = jfr::parse(&recording).map_err(|source| IngestError::Jfr { part, source })?;
    let series = converted
        .into_iter()
        .map(|s| ProfileSeries {
            sample_type: s.name_suffix.to_owned(),
            name_suffix: s.name_suffix.to_owned(),
            units: s.units.to_owned(),
            aggregation: s.aggregation,
            cumulative: false,
            // The agent's `sampleRate` (its sampling interval) applies to CPU samples.
            sample_rate: None,
            labels: Vec::new(),
            tree: s.tree,
            spans: Default::default(),
        })
        .collect();
    let mut out = Converted::default();
    to_profiles(params, series, &mut out)?;
    Ok(out.into_set("jfr", body.sent_bytes))
}

/// The body to parse for a bare `format=jfr` request.
pub(crate) fn parse_body(
    params: &IngestParams,
    body: &RequestBody,
) -> Result<ProfileSet, IngestError> {
    parse(params, &body.bytes, "jfr body", body)
}

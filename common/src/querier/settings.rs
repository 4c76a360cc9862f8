//! `settings.v1`: the per-tenant settings the Profiles Drilldown app reads at start
//! (`grafana/pyroscope:api/settings/v1/setting.proto`). Smolder stores no settings and answers
//! `Get` with none, so only `Get`'s messages are here.

use serde::{Deserialize, Serialize};

use crate::protojson;

/// `SettingsService/Get`: no fields.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GetSettingsRequest {}

/// The answer to `SettingsService/Get`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GetSettingsResponse {
    /// The tenant's settings.
    #[prost(message, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub settings: Vec<Setting>,
}

/// One setting.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Setting {
    /// Its name.
    #[prost(string, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub name: String,
    /// Its value.
    #[prost(string, tag = "2")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub value: String,
    /// When it was last set, in milliseconds since the Unix epoch.
    #[prost(int64, tag = "3")]
    #[serde(
        rename = "modifiedAt",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub modified_at: i64,
}

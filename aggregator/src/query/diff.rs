//! `GET /render-diff` (and `/pyroscope/render-diff`): two flame graphs aligned into one diff.
//!
//! | param | meaning |
//! |---|---|
//! | `leftQuery`, `rightQuery` | FlameQL selectors, both required; or both Pyroscope v1's `<profile type id>{selector}`, answered in the ids' units (CPU in nanoseconds) |
//! | `leftFrom`, `leftUntil`, `rightFrom`, `rightUntil` | the ranges, default `now-1h` and `now` |
//! | `format` | `json` only (the default) |
//! | `maxNodes`, `max-nodes` | node budget; a node stays when either side reaches it |
//!
//! The answer is Pyroscope's double-format flamebearer: seven integers per bar, raw values on
//! both sides, `leftTicks`/`rightTicks`, `timeline: null`. It is a 400 when both sides have data
//! and their units differ, or their sample rates differ and neither is 0 (an empty side takes
//! the other's metadata). `metadata.name` is `"diff"`; `metadata.appName` is `diff_<app>` when
//! both sides query the same app and `diff_<left app>_<right app>` otherwise (Pyroscope writes
//! these the other way round, which reads as a slip); `startTime`/`endTime` span both ranges.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use smolder_common::flamebearer::{FlamebearerProfile, Metadata};
use smolder_common::{ProfileMeta, Tree};

use super::{
    Params, Querier, QueryError, RawQuery, Selected, an_hour_before, blocking, no_meta, render,
    respond, select_and_merge, typed, unix_secs, with_warning,
};
use crate::tenant::Tenant;

/// The handler.
pub(super) async fn handle(
    State(querier): State<Arc<Querier>>,
    tenant: Tenant,
    query: RawQuery,
) -> Response {
    let started = Instant::now();
    let result = diff(&querier, tenant, query).await;
    respond(&querier, "render_diff", started, result)
}

async fn diff(
    querier: &Querier,
    tenant: Tenant,
    query: RawQuery,
) -> Result<(Response, &'static str), QueryError> {
    let params = Params::new(query)?;
    let now = SystemTime::now();
    if params.get("leftQuery").is_some_and(render::is_typed) {
        return typed_diff(querier, tenant, &params, now).await;
    }
    let left = params.selector("leftQuery")?;
    let right = params.selector("rightQuery")?;
    let left_range = params.range(("leftFrom", "leftUntil"), now, an_hour_before(now))?;
    let right_range = params.range(("rightFrom", "rightUntil"), now, an_hour_before(now))?;
    match params.get("format") {
        None | Some("json") => {}
        Some(other) => {
            return Err(QueryError::InvalidFormat {
                value: other.to_owned(),
                expected: "json",
            });
        }
    }
    let budget = params.node_budget(&querier.config)?;
    let max_nodes = budget.nodes;

    let app_name = if left.app() == right.app() {
        format!("diff_{}", left.app())
    } else {
        format!("diff_{}_{}", left.app(), right.app())
    };
    // Merging both sides, aligning them and laying out the diff is CPU work: all of it runs on
    // the blocking pool.
    let metrics = querier.metrics.clone();
    let profile = blocking(querier, move |store| {
        let left_side = select_and_merge(store, &tenant, &left, left_range, None)?;
        let right_side = select_and_merge(store, &tenant, &right, right_range, None)?;
        metrics.merged(
            "render_diff",
            left_side.series.len() + right_side.series.len(),
            left_side.tree.len() + right_side.tree.len(),
        );
        let meta = compatible(&left_side, &right_side)?;
        let metadata = Metadata {
            spy_name: meta.spy_name,
            sample_rate: meta.sample_rate,
            units: meta.units,
            name: "diff".to_owned(),
            app_name: Some(app_name),
            start_time: Some(unix_secs(left_range.from.min(right_range.from))),
            end_time: Some(unix_secs(left_range.until.max(right_range.until))),
            query: None,
            max_nodes: Some(u64::try_from(max_nodes).unwrap_or(u64::MAX)),
            ..Metadata::default()
        };
        let combined = Tree::combine(&left_side.tree, &right_side.tree);
        Ok(FlamebearerProfile::diff(&combined, max_nodes, metadata))
    })
    .await?;
    Ok((
        with_warning(Json(profile).into_response(), budget.warning),
        "json",
    ))
}

/// `/pyroscope/render-diff` of v1 queries (`<profile type id>{selector}` on both sides), as the
/// Profiles Drilldown app sends them: both sides in their id's units, with v1's metadata.
async fn typed_diff(
    querier: &Querier,
    tenant: Tenant,
    params: &Params,
    now: SystemTime,
) -> Result<(Response, &'static str), QueryError> {
    let side = |name: &'static str| render::typed_query(name, params.require(name)?);
    let (left_id, left) = side("leftQuery")?;
    let (right_id, right) = side("rightQuery")?;
    let left_range = params.range(("leftFrom", "leftUntil"), now, an_hour_before(now))?;
    let right_range = params.range(("rightFrom", "rightUntil"), now, an_hour_before(now))?;
    let budget = params.node_budget(&querier.config)?;
    let max_nodes = budget.nodes;
    let profile = blocking(querier, move |store| {
        let (l, _) = typed::merge(store, &tenant, &left_id, &left, left_range, None)?;
        let (r, _) = typed::merge(store, &tenant, &right_id, &right, right_range, None)?;
        let metadata = render::typed_metadata(&left_id);
        Ok(FlamebearerProfile::diff(
            &Tree::combine(&l, &r),
            max_nodes,
            metadata,
        ))
    })
    .await?;
    Ok((
        with_warning(Json(profile).into_response(), budget.warning),
        "json",
    ))
}

/// The metadata of the diff: the left side's, or the right's when the left is empty; an error
/// when both have data that measure different things.
fn compatible(left: &Selected, right: &Selected) -> Result<ProfileMeta, QueryError> {
    // A side with no data says nothing about units, as in Pyroscope's `isEmpty`.
    let meta = |side: &Selected| side.meta.clone().filter(|_| side.tree.total() > 0);
    match (meta(left), meta(right)) {
        (Some(l), Some(r)) => {
            if l.units != r.units {
                return Err(QueryError::Incompatible {
                    what: "units",
                    left: l.units,
                    right: r.units,
                });
            }
            if l.sample_rate != r.sample_rate && l.sample_rate != 0 && r.sample_rate != 0 {
                return Err(QueryError::Incompatible {
                    what: "sample rate",
                    left: l.sample_rate.to_string(),
                    right: r.sample_rate.to_string(),
                });
            }
            Ok(l)
        }
        (Some(only), None) | (None, Some(only)) => Ok(only),
        (None, None) => Ok(no_meta()),
    }
}

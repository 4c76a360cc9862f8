//! The sled backend through the store's interface, on a real database in a temporary
//! directory.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use smolder_common::{Aggregation, Profile, ProfileMeta, Selector, Series, Tree};

use super::keys;
use super::*;
use crate::metrics::Metrics;
use crate::store::{BUCKET, unix};

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn profile(series: &str, from: u64, stacks: &[(&str, u64)]) -> Profile {
    let mut tree = Tree::new();
    for (stack, value) in stacks {
        tree.insert_names(stack.split(';'), *value);
    }
    Profile {
        series: Series::parse(series).unwrap(),
        meta: ProfileMeta::default(),
        from: at(from),
        until: at(from + 10),
        tree,
    }
}

fn metrics() -> StoreMetrics {
    StoreMetrics::new(Metrics::new().registry())
}

fn open(dir: &Path) -> SledStore {
    open_with(dir, StoreConfig::default())
}

/// Opens the store in `dir`. sled releases its own file lock from background threads a moment
/// after the last handle of a closed database drops, so a reopen retries that for a while.
fn open_with(dir: &Path, config: StoreConfig) -> SledStore {
    let mut attempts = 0;
    loop {
        match SledStore::open(dir, config.clone(), metrics()) {
            Ok(store) => return store,
            Err(StoreError::Engine { source })
                if attempts < 50 && source.to_string().contains("could not acquire lock") =>
            {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(err) => panic!("opening the store: {err}"),
        }
    }
}

fn range(from: u64, until: u64) -> TimeRange {
    TimeRange {
        from: at(from),
        until: at(until),
    }
}

fn folded(tree: &Tree) -> String {
    smolder_common::to_folded(tree)
}

fn selector(text: &str) -> Selector {
    Selector::parse(text).unwrap()
}

fn anonymous() -> Tenant {
    Tenant::anonymous()
}

/// Writes `profiles` without a batch marker.
async fn write(store: &SledStore, profiles: Vec<Profile>) -> Result<(), StoreError> {
    store.write(&anonymous(), profiles, None).await.map(|_| ())
}

/// The `sum` trees `selector` matches over `range`, at the finest resolution.
fn merge(store: &SledStore, selector: &Selector, range: TimeRange) -> Merged {
    store.merge(&anonymous(), selector, range, BUCKET).unwrap()
}

#[tokio::test]
async fn writes_merge_per_series_and_read_back_over_any_range() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let base = 1_700_000_000;
    write(
        &store,
        vec![profile("app.cpu{env=prod}", base, &[("main;a", 2)])],
    )
    .await
    .unwrap();
    write(
        &store,
        vec![profile("app.cpu{env=prod}", base + 10, &[("main;a", 3)])],
    )
    .await
    .unwrap();
    write(
        &store,
        vec![profile("app.cpu{env=dev}", base + 20_000, &[("main;b", 4)])],
    )
    .await
    .unwrap();

    let all = store
        .series(
            &anonymous(),
            &selector("app.cpu"),
            range(base, base + 86_400),
        )
        .unwrap();
    assert_eq!(all.len(), 2);
    let merged = merge(
        &store,
        &selector("app.cpu"),
        range(base - 5_000, base + 86_400),
    );
    assert_eq!(folded(&merged.sum.tree), "main;a 5\nmain;b 4\n");
    assert_eq!(merged.sum.writes, 3);
    assert_eq!(merged.series, all);

    let prod_selector = selector(r#"app.cpu{env="prod"}"#);
    let prod = store
        .series(&anonymous(), &prod_selector, range(base, base + 20))
        .unwrap();
    assert_eq!(prod.len(), 1);
    let first = merge(&store, &prod_selector, range(base, base + 10));
    assert_eq!(folded(&first.sum.tree), "main;a 2\n");

    let timelines = store
        .timelines(
            &anonymous(),
            &selector("app.cpu"),
            range(base, base + 30),
            10,
            None,
        )
        .unwrap();
    assert_eq!(timelines.groups[&None], [2, 3, 0]);
    assert_eq!(timelines.start, base);
}

#[tokio::test]
async fn resolution_widens_the_merged_range_to_its_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let base = 1_700_000_000;
    write(
        &store,
        vec![
            profile("app.cpu", base + 20, &[("a", 1)]),
            profile("app.cpu", base + 80, &[("b", 2)]),
        ],
    )
    .await
    .unwrap();
    let app = selector("app.cpu");
    assert_eq!(
        folded(&merge(&store, &app, range(base + 20, base + 30)).sum.tree),
        "a 1\n"
    );
    let coarse = store
        .merge(&anonymous(), &app, range(base + 20, base + 30), 100)
        .unwrap();
    assert_eq!(folded(&coarse.sum.tree), "a 1\nb 2\n");
}

#[tokio::test]
async fn timelines_group_by_a_label_and_keep_series_without_it_apart() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let base = 1_700_000_000;
    write(
        &store,
        vec![
            profile("app.cpu{env=prod}", base, &[("a", 1)]),
            profile("app.cpu{env=prod,zone=z1}", base + 10, &[("a", 2)]),
            profile("app.cpu{env=dev}", base, &[("a", 4)]),
            profile("app.cpu", base + 10, &[("a", 8)]),
        ],
    )
    .await
    .unwrap();
    let timelines = store
        .timelines(
            &anonymous(),
            &selector("app.cpu"),
            range(base, base + 20),
            10,
            Some("env"),
        )
        .unwrap();
    assert_eq!(timelines.points, 2);
    assert_eq!(timelines.groups[&Some("prod".to_owned())], [1, 2]);
    assert_eq!(timelines.groups[&Some("dev".to_owned())], [4, 0]);
    assert_eq!(timelines.groups[&None], [0, 8]);
    assert_eq!(timelines.groups.len(), 3);
}

#[tokio::test]
async fn a_batch_is_stored_once_across_reopens_until_retention_forgets_it() {
    let dir = tempfile::tempdir().unwrap();
    let base = 1_700_000_000 / 10_000 * 10_000;
    let marker = |sequence| BatchMarker {
        agent_id: "agent-1".to_owned(),
        sequence,
        window_end: base + 10,
    };
    let batch = || vec![profile("app.cpu", base, &[("main;a", 2)])];
    let store = open(dir.path());
    assert_eq!(
        store
            .write(&anonymous(), batch(), Some(marker(1)))
            .await
            .unwrap(),
        Written::Stored
    );
    assert_eq!(
        store
            .write(&anonymous(), batch(), Some(marker(1)))
            .await
            .unwrap(),
        Written::Duplicate
    );
    store.close().await.unwrap();
    drop(store);

    let config = StoreConfig {
        retention: Duration::from_secs(86_400),
        ..StoreConfig::default()
    };
    let store = open_with(dir.path(), config);
    assert_eq!(
        store
            .write(&anonymous(), batch(), Some(marker(1)))
            .await
            .unwrap(),
        Written::Duplicate
    );
    assert_eq!(
        store
            .write(&anonymous(), batch(), Some(marker(2)))
            .await
            .unwrap(),
        Written::Stored
    );
    let merged = merge(&store, &selector("app.cpu"), range(base, base + 10));
    assert_eq!(folded(&merged.sum.tree), "main;a 4\n");

    store
        .enforce_retention(at(base + 2 * 86_400))
        .await
        .unwrap();
    let markers = store
        .inner
        .data
        .scan_prefix([keys::BATCH])
        .chain(store.inner.data.scan_prefix([keys::BATCH_BY_TIME]))
        .count();
    assert_eq!(markers, 0, "retention deletes markers with their data");
}

#[tokio::test]
async fn rollups_agree_with_fine_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let base = 1_700_000_000 / 10_000 * 10_000;
    let mut profiles = Vec::new();
    for i in 0..200u64 {
        profiles.push(profile(
            "app.cpu",
            base + i * 70,
            &[("main;f", i + 1), ("main;g", 1)],
        ));
    }
    write(&store, profiles).await.unwrap();
    // Any range must equal the sum of its 10 s buckets: before the rollups are built (reads
    // descend into dirty rollups) and after (reads use them).
    let check = |store: &SledStore| {
        for (from, until) in [
            (base, base + 14_000),
            (base + 130, base + 9_870),
            (base + 10, base + 20),
        ] {
            let merged = merge(store, &selector("app.cpu"), range(from, until));
            let expected: u64 = (0..200u64)
                .filter(|i| {
                    let bucket = (base + i * 70 + 5) / 10 * 10;
                    bucket >= from / 10 * 10 && bucket < until.div_ceil(10) * 10
                })
                .map(|i| i + 2)
                .sum();
            assert_eq!(merged.sum.tree.total(), expected, "range {from}..{until}");
        }
    };
    check(&store);
    // 200 profiles 70 s apart span 14 000 s: 140 100 s, 14 1000 s and 2 10 000 s rollups.
    assert_eq!(store.rollup(at(base + 100_000)).await.unwrap(), 156);
    assert_eq!(store.inner.data.scan_prefix([keys::DIRTY]).count(), 0);
    check(&store);
    assert_eq!(
        store.rollup(at(base + 100_000)).await.unwrap(),
        0,
        "built once"
    );
}

#[tokio::test]
async fn acknowledged_writes_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        write(&store, vec![profile("app.cpu", 1_700_000_000, &[("a", 1)])])
            .await
            .unwrap();
        store.close().await.unwrap();
    }
    let store = open(dir.path());
    assert_eq!(
        merge(&store, &selector("app.cpu"), range(0, 2_000_000_000))
            .sum
            .tree
            .total(),
        1
    );
    write(
        &store,
        vec![profile("app2.cpu", 1_700_000_000, &[("b", 1)])],
    )
    .await
    .unwrap();
    let apps: Vec<_> = store
        .apps(&anonymous())
        .unwrap()
        .into_iter()
        .map(|a| a.name)
        .collect();
    assert_eq!(apps, ["app.cpu", "app2.cpu"]);
}

#[tokio::test]
async fn a_second_store_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = open(dir.path());
    let err = SledStore::open(dir.path(), StoreConfig::default(), metrics())
        .err()
        .expect("second open fails");
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert!(
        err.to_string().contains("in use by another aggregator"),
        "{err}"
    );
}

#[tokio::test]
async fn concurrent_writes_sum_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut tasks = Vec::new();
    for i in 0..40u64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            write(
                &store,
                vec![profile("app.cpu", 1_700_000_000, &[("main;x", i + 1)])],
            )
            .await
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let merged = merge(&store, &selector("app.cpu"), range(0, 2_000_000_000));
    assert_eq!(merged.sum.tree.total(), (1..=40).sum::<u64>());
    assert_eq!(merged.sum.writes, 40);
}

#[tokio::test]
async fn labels_values_and_deletion() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let base = 1_700_000_000;
    write(
        &store,
        vec![
            profile(
                "app.cpu{env=prod,process.runtime.name=go}",
                base,
                &[("a", 1)],
            ),
            profile("app.cpu{env=dev}", base, &[("a", 1)]),
            profile("other.cpu{zone=z1}", base + 5_000, &[("a", 1)]),
        ],
    )
    .await
    .unwrap();
    let tenant = anonymous();
    let wide = range(base, base + 10_000);
    assert_eq!(
        store.label_names(&tenant, None, wide).unwrap(),
        ["env", "process.runtime.name", "zone"]
    );
    assert_eq!(
        store.label_names(&tenant, Some("app.cpu"), wide).unwrap(),
        ["env", "process.runtime.name"]
    );
    assert_eq!(
        store
            .label_names(&tenant, None, range(base, base + 100))
            .unwrap(),
        ["env", "process.runtime.name"]
    );
    assert_eq!(
        store.label_values(&tenant, "env", None, wide).unwrap(),
        ["dev", "prod"]
    );
    assert_eq!(
        store.label_values(&tenant, "__name__", None, wide).unwrap(),
        ["app.cpu", "other.cpu"]
    );
    let prod = selector(r#"app.cpu{env!="dev"}"#);
    assert_eq!(
        store
            .label_values(&tenant, "env", Some(&prod), wide)
            .unwrap(),
        ["prod"]
    );

    assert_eq!(store.delete_app(&tenant, "app.cpu").await.unwrap(), 2);
    assert_eq!(
        store.label_values(&tenant, "__name__", None, wide).unwrap(),
        ["other.cpu"]
    );
    assert!(
        store
            .series(&tenant, &selector("app.cpu"), wide)
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.delete_app(&tenant, "app.cpu").await.unwrap(), 0);
}

#[tokio::test]
async fn retention_deletes_old_buckets_and_empty_series() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        retention: Duration::from_secs(86_400),
        ..StoreConfig::default()
    };
    let store = open_with(dir.path(), config);
    let now = 1_700_000_000 / 10_000 * 10_000;
    write(
        &store,
        vec![
            profile("old.cpu", now - 3 * 86_400, &[("a", 1)]),
            profile("mixed.cpu", now - 2 * 86_400, &[("a", 1)]),
            profile("mixed.cpu", now - 3_600, &[("b", 1)]),
        ],
    )
    .await
    .unwrap();
    let report = store.enforce_retention(at(now)).await.unwrap();
    assert_eq!(report.series, 1);
    assert_eq!(
        report.buckets, 2,
        "the two old 10 s buckets; no rollup was built yet"
    );
    let everything = range(0, now + 10);
    assert!(
        store
            .series(&anonymous(), &selector("old.cpu"), everything)
            .unwrap()
            .is_empty()
    );
    let mixed = store
        .series(&anonymous(), &selector("mixed.cpu"), everything)
        .unwrap();
    assert_eq!(
        folded(&merge(&store, &selector("mixed.cpu"), everything).sum.tree),
        "b 1\n"
    );
    assert!(mixed[0].first_seen >= now - 86_400);
}

#[tokio::test]
async fn past_the_size_limit_the_oldest_data_goes_first() {
    let dir = tempfile::tempdir().unwrap();
    // A limit any store exceeds: every pass deletes the oldest 10 000 s.
    let config = StoreConfig {
        max_disk_bytes: 1,
        ..StoreConfig::default()
    };
    let store = open_with(dir.path(), config);
    let base = unix(SystemTime::now()) / 10_000 * 10_000 - 30_000;
    write(
        &store,
        vec![
            profile("app.cpu", base + 10, &[("oldest", 1)]),
            profile("app.cpu", base + 10_010, &[("middle", 1)]),
            profile("app.cpu", base + 20_010, &[("newest", 1)]),
        ],
    )
    .await
    .unwrap();
    let everything = range(base, base + 30_000);
    store.enforce_retention(at(base + 30_000)).await.unwrap();
    let merged = merge(&store, &selector("app.cpu"), everything);
    assert_eq!(folded(&merged.sum.tree), "middle 1\nnewest 1\n");
    store.enforce_retention(at(base + 30_000)).await.unwrap();
    let merged = merge(&store, &selector("app.cpu"), everything);
    assert_eq!(folded(&merged.sum.tree), "newest 1\n");
}

#[tokio::test]
async fn corrupt_buckets_are_reported_with_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    write(&store, vec![profile("app.cpu", 1_700_000_000, &[("a", 1)])])
        .await
        .unwrap();
    let key = keys::bucket(keys::TREE, 0, 1, 1_700_000_000);
    let mut value = store.inner.data.get(key).unwrap().unwrap().to_vec();
    value[6] ^= 0xff;
    store.inner.data.insert(key, value).unwrap();
    let err = store
        .merge(
            &anonymous(),
            &selector("app.cpu"),
            range(1_700_000_000, 1_700_000_010),
            BUCKET,
        )
        .unwrap_err();
    assert!(
        err.to_string().starts_with(r"corrupt record at key T\x00"),
        "{err}"
    );
    // The series stays writable: the damaged bucket is replaced by the next write.
    write(&store, vec![profile("app.cpu", 1_700_000_000, &[("b", 2)])])
        .await
        .unwrap();
    let merged = merge(
        &store,
        &selector("app.cpu"),
        range(1_700_000_000, 1_700_000_010),
    );
    assert_eq!(folded(&merged.sum.tree), "b 2\n");
}

#[tokio::test]
async fn metadata_of_the_latest_write_wins_and_average_series_merge_apart() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut p = profile("app.inuse_space", 1_700_000_000, &[("a", 10)]);
    p.meta = ProfileMeta {
        spy_name: "gospy".into(),
        sample_rate: 0,
        units: "bytes".into(),
        aggregation: Aggregation::Average,
    };
    write(&store, vec![p]).await.unwrap();
    let apps = store.apps(&anonymous()).unwrap();
    assert_eq!(apps[0].meta.units, "bytes");
    assert_eq!(apps[0].meta.aggregation, Aggregation::Average);
    let merged = merge(
        &store,
        &selector("app.inuse_space"),
        range(0, 2_000_000_000),
    );
    assert_eq!(
        (merged.average.tree.total(), merged.average.writes),
        (10, 1)
    );
    assert_eq!(merged.sum.tree.total(), 0);
    store.close().await.unwrap();
    assert!(matches!(
        write(&store, vec![profile("app.cpu", 1, &[("a", 1)])]).await,
        Err(StoreError::Closed)
    ));
}

#[tokio::test]
async fn rules_are_stored_through_the_writer_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let tenant = anonymous();
    {
        let store = open(dir.path());
        store
            .put_rule(&tenant, "b_total", b"{\"expr\":\"b\"}".to_vec())
            .await
            .unwrap();
        store
            .put_rule(&tenant, "a_total", b"{\"expr\":\"a\"}".to_vec())
            .await
            .unwrap();
        store
            .put_rule(&tenant, "a_total", b"{\"expr\":\"a2\"}".to_vec())
            .await
            .unwrap();
        assert!(store.delete_rule(&tenant, "b_total").await.unwrap());
        assert!(!store.delete_rule(&tenant, "b_total").await.unwrap());
        store.close().await.unwrap();
    }
    let store = open(dir.path());
    assert_eq!(
        store.rules(&tenant).unwrap(),
        [("a_total".to_owned(), b"{\"expr\":\"a2\"}".to_vec())]
    );
}

#[tokio::test]
async fn other_tenants_are_refused_naming_the_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let other = Tenant::new("team-a").unwrap();
    let err = store
        .write(
            &other,
            vec![profile("app.cpu", 1_700_000_000, &[("a", 1)])],
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::UnknownTenant { .. }), "{err}");
    assert!(err.to_string().contains("\"team-a\""), "{err}");
    assert!(store.apps(&other).is_err());
    assert!(store.rules(&other).is_err());
    assert!(
        store.apps(&anonymous()).unwrap().is_empty(),
        "nothing was written"
    );
}

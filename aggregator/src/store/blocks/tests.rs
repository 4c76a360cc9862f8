//! The block store through the store's interface, on real directories: the head, cuts,
//! compaction, downsampling, retention, crashes simulated at each step, damaged blocks and the
//! migration of a v0.1 data directory.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use smolder_common::{Aggregation, Profile, ProfileMeta, Selector, Series, Tree};

use super::*;
use crate::metrics::Metrics;
use crate::store::BUCKET;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// A recent time on a 100 000 s boundary, so that retention keeps what tests write.
fn base() -> u64 {
    unix(SystemTime::now()) / 100_000 * 100_000 - 200_000
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

fn open(dir: &Path) -> BlockStore {
    open_with(dir, StoreConfig::default())
}

/// The store's metrics in a registry of their own.
fn store_metrics() -> StoreMetrics {
    let metrics = Metrics::new();
    StoreMetrics::new(metrics.registry(), &metrics.health)
}

/// Opens the store in `dir`; sled releases its file lock from background threads a moment
/// after a closed database drops, so a reopen retries that for a while.
fn open_with(dir: &Path, config: StoreConfig) -> BlockStore {
    let mut attempts = 0;
    loop {
        match BlockStore::open(dir, config.clone(), store_metrics()) {
            Ok(store) => return store,
            Err(StoreError::Engine { source })
                if attempts < 100 && source.to_string().contains("could not acquire lock") =>
            {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(err) => panic!("opening the store: {err}"),
        }
    }
}

async fn reopen(store: BlockStore, dir: &Path, config: StoreConfig) -> BlockStore {
    store.close().await.unwrap();
    drop(store);
    open_with(dir, config)
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

async fn write(store: &BlockStore, profiles: Vec<Profile>) {
    store.write(&anonymous(), profiles, None).await.unwrap();
}

fn merge(store: &BlockStore, query: &str, from: u64, until: u64) -> Merged {
    store
        .merge(&anonymous(), &selector(query), range(from, until), BUCKET)
        .unwrap()
}

fn total(store: &BlockStore, query: &str, from: u64, until: u64) -> u64 {
    merge(store, query, from, until).sum.tree.total()
}

fn block_count(store: &BlockStore) -> usize {
    store.inner.shared.state().blocks.all().count()
}

#[tokio::test]
async fn reads_agree_before_and_after_the_cut_and_every_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let base = base();
    // 300 profiles 70 s apart: 21 000 s, three 10 000 s ranges, 22 head ranges.
    for i in 0..300u64 {
        write(
            &store,
            vec![
                profile(
                    "app.cpu{env=prod}",
                    base + i * 70,
                    &[("main;f", i + 1), ("main;g", 1)],
                ),
                profile("app.cpu{env=dev}", base + i * 70, &[("main;h", 2)]),
            ],
        )
        .await;
    }
    let ranges = [
        (base, base + 21_000),
        (base + 130, base + 9_870),
        (base + 10, base + 20),
        (base + 9_990, base + 20_020),
    ];
    let expected = |from: u64, until: u64| -> u64 {
        (0..300u64)
            .filter(|i| {
                let bucket = base + i * 70;
                bucket >= from / 10 * 10 && bucket < until.div_ceil(10) * 10
            })
            .map(|i| i + 1 + 1 + 2)
            .sum()
    };
    let check = |store: &BlockStore, step: &str| {
        for (from, until) in ranges {
            assert_eq!(
                total(store, "app.cpu", from, until),
                expected(from, until),
                "{step}: {from}..{until}"
            );
        }
        let timelines = store
            .timelines(
                &anonymous(),
                &selector("app.cpu"),
                range(base, base + 21_000),
                1_000,
                Some("env"),
            )
            .unwrap();
        let prod: u64 = timelines.groups[&Some("prod".to_owned())].iter().sum();
        assert_eq!(prod, (1..=300).sum::<u64>() + 300, "{step}: timeline");
        let series = store
            .series(
                &anonymous(),
                &selector("app.cpu"),
                range(base, base + 21_000),
            )
            .unwrap();
        assert_eq!(series.len(), 2, "{step}");
        assert_eq!(series[0].first_seen, base, "{step}");
        assert_eq!(series[0].last_seen, base + 299 * 70 / 10 * 10, "{step}");
    };
    check(&store, "head");
    let now = base + 21_000 + plan::CUT_GRACE;
    assert_eq!(store.cut(at(now)).await.unwrap(), 21);
    assert_eq!(store.inner.shared.state().head.series_count(), 0);
    check(&store, "cut");
    let report = store
        .compact(at(now + plan::COMPACTION_GRACE))
        .await
        .unwrap();
    assert_eq!((report.merged, report.inputs), (2, 20));
    check(&store, "compacted to 10 000 s");
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    check(&store, "reopened");
    let report = store.compact(at(base + 200_000)).await.unwrap();
    assert_eq!(report.merged, 1);
    assert_eq!(block_count(&store), 1, "one 100 000 s block");
    check(&store, "compacted to 100 000 s");
    let files: Vec<_> = walk(&dir.path().join("blocks"));
    assert_eq!(files.len(), 1, "no file left behind: {files:?}");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.path().is_dir() {
            out.extend(walk(&entry.path()));
        } else {
            out.push(entry.path());
        }
    }
    out
}

#[tokio::test]
async fn a_batch_is_stored_once_across_cut_compaction_and_reopen_until_retention_forgets_it() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let marker = |sequence| BatchMarker {
        agent_id: "agent-1".to_owned(),
        sequence,
        window_end: base + 10,
    };
    let batch = || vec![profile("app.cpu", base, &[("main;a", 2)])];
    let store = open(dir.path());
    let send =
        |store: &BlockStore, sequence| store.write(&anonymous(), batch(), Some(marker(sequence)));
    assert_eq!(send(&store, 1).await.unwrap(), Written::Stored);
    assert_eq!(send(&store, 1).await.unwrap(), Written::Duplicate);
    store.cut(at(base + 2_000)).await.unwrap();
    assert_eq!(
        send(&store, 1).await.unwrap(),
        Written::Duplicate,
        "after the cut"
    );
    store.compact(at(base + 20_000)).await.unwrap();
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    assert_eq!(
        send(&store, 1).await.unwrap(),
        Written::Duplicate,
        "after reopening"
    );
    assert_eq!(send(&store, 2).await.unwrap(), Written::Stored);
    assert_eq!(total(&store, "app.cpu", base, base + 10), 4);
    let report = store
        .enforce_retention(at(base + 100 * 86_400))
        .await
        .unwrap();
    assert_eq!(
        report.markers, 2,
        "retention forgets markers with their data"
    );
}

#[tokio::test]
async fn a_crash_between_writing_a_cut_and_deleting_the_head_counts_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    write(&store, vec![profile("app.cpu", base, &[("a", 1)])]).await;
    store
        .write(
            &anonymous(),
            vec![profile("app.cpu", base + 10, &[("b", 2)])],
            Some(BatchMarker {
                agent_id: "host".into(),
                sequence: 7,
                window_end: base + 20,
            }),
        )
        .await
        .unwrap();
    let records = store.inner.shared.wal.records().unwrap();
    assert_eq!(records.len(), 2);
    store.cut(at(base + 2_000)).await.unwrap();
    // As if the process died after the block was written and before the records went.
    for (range, record) in &records {
        store
            .inner
            .shared
            .wal
            .append(*range, &record.frame())
            .unwrap();
    }
    store.inner.shared.wal.flush().unwrap();
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    assert_eq!(total(&store, "app.cpu", base, base + 100), 3);
    assert!(
        store.inner.shared.wal.records().unwrap().is_empty(),
        "replay dropped them"
    );
    // Late data for the cut range lands in a new block, merged by the next compaction.
    write(&store, vec![profile("app.cpu", base + 20, &[("c", 4)])]).await;
    assert_eq!(total(&store, "app.cpu", base, base + 100), 7);
    store.cut(at(base + 2_000)).await.unwrap();
    assert_eq!(block_count(&store), 2);
    assert_eq!(total(&store, "app.cpu", base, base + 100), 7);
    store.compact(at(base + 20_000)).await.unwrap();
    assert_eq!(block_count(&store), 1);
    assert_eq!(total(&store, "app.cpu", base, base + 100), 7);
}

/// A write's record durable in its log, the write counter's update not (a kill between the
/// two syncs): the replayed record is cut into a block, and a later write must not take its
/// number again, or its marker would equal the block's and the write would be dropped as a
/// retry (found by the kill -9 test).
#[tokio::test]
async fn a_write_number_replayed_from_the_log_is_never_given_out_again() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    write(&store, vec![profile("app.cpu", base, &[("a", 1)])]).await;
    // As if the process died after the log's sync and before the database's.
    let mut batch = sled::Batch::default();
    wal::Wal::set_meta(&mut batch, "next_write", &1u64.to_be_bytes());
    store.inner.shared.wal.apply(batch).unwrap();
    store.inner.shared.wal.flush().unwrap();
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    store.cut(at(base + 2_000)).await.unwrap();
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    write(&store, vec![profile("app.cpu", base + 10, &[("b", 2)])]).await;
    assert_eq!(total(&store, "app.cpu", base, base + 100), 3);
    // Replayed with the block of its range there: kept, being another write.
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    assert_eq!(total(&store, "app.cpu", base, base + 100), 3);
    store.cut(at(base + 2_000)).await.unwrap();
    assert_eq!(total(&store, "app.cpu", base, base + 100), 3);
    store.compact(at(base + 20_000)).await.unwrap();
    assert_eq!(total(&store, "app.cpu", base, base + 100), 3);
}

#[tokio::test]
async fn a_crash_between_writing_a_merge_and_deleting_its_inputs_shows_the_merge_only() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    for i in 0..5 {
        write(
            &store,
            vec![profile("app.cpu", base + i * 1_000, &[("a", 1)])],
        )
        .await;
    }
    store.cut(at(base + 20_000)).await.unwrap();
    let inputs: Vec<(std::path::PathBuf, Vec<u8>)> = walk(&dir.path().join("blocks"))
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    assert_eq!(inputs.len(), 5);
    store.compact(at(base + 20_000)).await.unwrap();
    assert_eq!(walk(&dir.path().join("blocks")).len(), 1);
    // As if the process died before the inputs were deleted.
    for (path, bytes) in &inputs {
        std::fs::write(path, bytes).unwrap();
    }
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    assert_eq!(total(&store, "app.cpu", base, base + 10_000), 5);
    assert_eq!(
        walk(&dir.path().join("blocks")).len(),
        1,
        "replaced inputs deleted at open"
    );
    // The merge repeated writes the same block.
    assert_eq!(store.compact(at(base + 20_000)).await.unwrap().merged, 0);
}

#[tokio::test]
async fn late_data_after_compaction_is_queryable_once_and_merged_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    for i in 0..100u64 {
        write(
            &store,
            vec![profile("app.cpu", base + i * 100, &[("a", 1)])],
        )
        .await;
    }
    let now = base + 100_000 + 3_600;
    store.cut(at(now)).await.unwrap();
    store.compact(at(now)).await.unwrap();
    assert_eq!(block_count(&store), 1);
    // A window 6 h old arrives (an agent spooled it).
    let late = BatchMarker {
        agent_id: "spooled".into(),
        sequence: 1,
        window_end: base + 5_010,
    };
    let batch = vec![profile("app.cpu", base + 5_000, &[("late", 10)])];
    assert_eq!(
        store
            .write(&anonymous(), batch.clone(), Some(late.clone()))
            .await
            .unwrap(),
        Written::Stored
    );
    assert_eq!(total(&store, "app.cpu", base, base + 100_000), 110);
    store.cut(at(now + 10)).await.unwrap();
    assert_eq!(block_count(&store), 2);
    assert_eq!(total(&store, "app.cpu", base, base + 100_000), 110);
    assert_eq!(
        store.write(&anonymous(), batch, Some(late)).await.unwrap(),
        Written::Duplicate
    );
    store.compact(at(now + 10)).await.unwrap();
    assert_eq!(block_count(&store), 1);
    assert_eq!(total(&store, "app.cpu", base, base + 100_000), 110);
    assert_eq!(
        folded(
            &merge(&store, "app.cpu", base + 5_000, base + 5_010)
                .sum
                .tree
        ),
        "a 1\nlate 10\n"
    );
}

#[tokio::test]
async fn old_data_is_downsampled_and_keeps_its_totals() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let config = StoreConfig {
        downsample_to_100s_after: Duration::from_secs(3_600),
        ..StoreConfig::default()
    };
    let store = open_with(dir.path(), config.clone());
    for i in 0..50u64 {
        write(&store, vec![profile("app.cpu", base + i * 10, &[("a", 1)])]).await;
    }
    store.cut(at(base + 100_000)).await.unwrap();
    store.compact(at(base + 100_000 + 3_600)).await.unwrap();
    let blocks = Arc::clone(&store.inner.shared.state().blocks);
    let block = blocks.all().next().unwrap();
    assert_eq!(block.finest(), 100);
    assert_eq!(total(&store, "app.cpu", base, base + 1_000), 50);
    // A 10 s range reads the 100 s bucket holding it.
    assert_eq!(total(&store, "app.cpu", base + 10, base + 20), 10);
}

#[tokio::test]
async fn retention_deletes_whole_blocks_by_age_and_the_oldest_past_the_size_limit() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    for i in 0..3u64 {
        write(
            &store,
            vec![profile("app.cpu", base + i * 10_000, &[("a", 1)])],
        )
        .await;
    }
    store.cut(at(base + 30_000)).await.unwrap();
    assert_eq!(block_count(&store), 3);
    let blocks_bytes = || -> u64 {
        walk(&dir.path().join("blocks"))
            .iter()
            .map(|f| f.metadata().unwrap().len())
            .sum()
    };
    let before = blocks_bytes();
    let report = store
        .enforce_retention(at(base + 30 * 86_400 + 10_000))
        .await
        .unwrap();
    assert_eq!(report.blocks, 1);
    assert_eq!(total(&store, "app.cpu", base, base + 30_000), 2);
    let after = blocks_bytes();
    assert!(
        after < before && walk(&dir.path().join("blocks")).len() == 2,
        "the aged-out block's file is gone at once: {before} -> {after} bytes"
    );
    let store = reopen(
        store,
        dir.path(),
        StoreConfig {
            max_disk_bytes: 1,
            ..StoreConfig::default()
        },
    )
    .await;
    store.enforce_retention(SystemTime::now()).await.unwrap();
    assert_eq!(
        block_count(&store),
        0,
        "past the limit every block goes, oldest first"
    );
}

#[tokio::test]
async fn labels_values_apps_and_deletion_across_head_and_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    write(
        &store,
        vec![
            profile("app.cpu{env=prod,zone=z1}", base, &[("a", 1)]),
            profile("other.cpu{team=x}", base, &[("b", 1)]),
        ],
    )
    .await;
    store.cut(at(base + 2_000)).await.unwrap();
    write(
        &store,
        vec![profile("app.cpu{env=dev}", base + 5_000, &[("c", 1)])],
    )
    .await;
    let all = range(base, base + 10_000);
    assert_eq!(
        store
            .label_names(&anonymous(), Some("app.cpu"), all)
            .unwrap(),
        ["env", "zone"]
    );
    assert_eq!(
        store.label_values(&anonymous(), "env", None, all).unwrap(),
        ["dev", "prod"]
    );
    assert_eq!(
        store
            .label_values(&anonymous(), "__name__", None, all)
            .unwrap(),
        ["app.cpu", "other.cpu"]
    );
    assert_eq!(store.apps(&anonymous()).unwrap().len(), 2);
    assert_eq!(store.delete_app(&anonymous(), "app.cpu").await.unwrap(), 2);
    assert_eq!(total(&store, "app.cpu", base, base + 10_000), 0);
    assert_eq!(total(&store, "other.cpu", base, base + 10_000), 1);
    let apps = store.apps(&anonymous()).unwrap();
    assert_eq!(
        apps.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
        ["other.cpu"]
    );
    // New data of the app after the deletion is shown, through compaction and a reopen.
    write(
        &store,
        vec![profile("app.cpu", base + 1_000, &[("new", 5)])],
    )
    .await;
    store.cut(at(base + 20_000)).await.unwrap();
    assert_eq!(total(&store, "app.cpu", base, base + 10_000), 5);
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    assert_eq!(total(&store, "app.cpu", base, base + 10_000), 5);
    store.compact(at(base + 20_000)).await.unwrap();
    assert_eq!(block_count(&store), 1);
    assert_eq!(
        folded(&merge(&store, "app.cpu", base, base + 10_000).sum.tree),
        "new 5\n"
    );
    assert_eq!(total(&store, "other.cpu", base, base + 10_000), 1);
    assert!(
        store.inner.shared.wal.tombstones().unwrap().is_empty(),
        "the deletion is applied and forgotten"
    );
}

#[tokio::test]
async fn concurrent_writes_sum_exactly_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            write(
                &store,
                vec![profile("app.cpu", base + (i % 4) * 10, &[("a", i + 1)])],
            )
            .await;
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let expected = (1..=64).sum::<u64>();
    assert_eq!(total(&store, "app.cpu", base, base + 40), expected);
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    assert_eq!(
        total(&store, "app.cpu", base, base + 40),
        expected,
        "the head replays"
    );
    assert!(matches!(
        BlockStore::open(dir.path(), StoreConfig::default(), store_metrics()),
        Err(StoreError::Locked { .. })
    ));
}

#[tokio::test]
async fn metadata_of_the_latest_write_wins_average_series_merge_apart_and_tenants_stay_apart() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    let mut p = profile("app.inuse_space", base, &[("a", 10)]);
    p.meta = ProfileMeta {
        spy_name: "gospy".into(),
        sample_rate: 0,
        units: "bytes".into(),
        aggregation: Aggregation::Average,
    };
    write(&store, vec![p.clone()]).await;
    store.cut(at(base + 2_000)).await.unwrap();
    write(&store, vec![p]).await;
    let apps = store.apps(&anonymous()).unwrap();
    assert_eq!(apps[0].meta.units, "bytes");
    let merged = merge(&store, "app.inuse_space", base, base + 10);
    assert_eq!(
        (merged.average.tree.total(), merged.average.writes),
        (20, 2)
    );
    assert_eq!(merged.sum.tree.total(), 0);
    let team = Tenant::new("team-a").unwrap();
    store
        .write(
            &team,
            vec![profile("app.inuse_space", base, &[("t", 1)])],
            None,
        )
        .await
        .unwrap();
    assert_eq!(store.apps(&team).unwrap().len(), 1);
    let theirs = store
        .merge(
            &team,
            &selector("app.inuse_space"),
            range(base, base + 10),
            BUCKET,
        )
        .unwrap();
    assert_eq!(theirs.sum.tree.total(), 1);
    assert_eq!(
        merge(&store, "app.inuse_space", base, base + 10)
            .average
            .tree
            .total(),
        20
    );
    store.close().await.unwrap();
    assert!(matches!(
        store.write(&anonymous(), vec![], None).await,
        Err(StoreError::Closed)
    ));
}

#[tokio::test]
async fn rules_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let tenant = anonymous();
    let store = open(dir.path());
    store
        .put_rule(&tenant, "b_total", b"b".to_vec())
        .await
        .unwrap();
    store
        .put_rule(&tenant, "a_total", b"a".to_vec())
        .await
        .unwrap();
    store
        .put_rule(&tenant, "a_total", b"a2".to_vec())
        .await
        .unwrap();
    assert!(store.delete_rule(&tenant, "b_total").await.unwrap());
    assert!(!store.delete_rule(&tenant, "b_total").await.unwrap());
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    assert_eq!(
        store.rules(&tenant).unwrap(),
        [("a_total".to_owned(), b"a2".to_vec())]
    );
    assert!(
        store
            .rules(&Tenant::new("other").unwrap())
            .unwrap()
            .is_empty()
    );
    let team = Tenant::new("team-a").unwrap();
    store
        .put_rule(&team, "t_total", b"t".to_vec())
        .await
        .unwrap();
    assert_eq!(store.rule_tenants().unwrap(), [tenant, team]);
}

#[tokio::test]
async fn two_tenants_agents_never_share_a_batch_marker() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let marker = BatchMarker {
        agent_id: "host-1".to_owned(),
        sequence: 1,
        window_end: base + 10,
    };
    let store = open(dir.path());
    let (a, b) = (
        Tenant::new("team-a").unwrap(),
        Tenant::new("team-b").unwrap(),
    );
    for tenant in [&a, &b, &anonymous()] {
        let batch = vec![profile("app.cpu", base, &[("main", 2)])];
        assert_eq!(
            store
                .write(tenant, batch.clone(), Some(marker.clone()))
                .await
                .unwrap(),
            Written::Stored,
            "{tenant}"
        );
        assert_eq!(
            store
                .write(tenant, batch, Some(marker.clone()))
                .await
                .unwrap(),
            Written::Duplicate,
            "{tenant}"
        );
    }
    for tenant in [&a, &b] {
        let series = store
            .series(tenant, &selector("app.cpu"), range(base - 10, base + 20))
            .unwrap();
        assert_eq!(series.len(), 1, "{tenant}");
    }
}

#[tokio::test]
async fn damaged_blocks_are_named_and_the_rest_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    for i in 0..3u64 {
        write(
            &store,
            vec![profile("app.cpu", base + i * 1_000, &[("a", 1)])],
        )
        .await;
    }
    store.cut(at(base + 5_000)).await.unwrap();
    let mut files = walk(&dir.path().join("blocks"));
    files.sort();
    // A flipped byte in the first block's trees (found by a read), a truncated second block
    // (found at open), a block of a newer format (found at open).
    let mut bytes = std::fs::read(&files[0]).unwrap();
    bytes[9] ^= 0xff;
    std::fs::write(&files[0], &bytes).unwrap();
    let bytes = std::fs::read(&files[1]).unwrap();
    std::fs::write(&files[1], &bytes[..bytes.len() - 5]).unwrap();
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    assert_eq!(store.inner.shared.metrics.bad_blocks.get(), 1);
    assert_eq!(
        total(&store, "app.cpu", base, base + 3_000),
        1,
        "the third block is served"
    );
    assert_eq!(
        store.inner.shared.metrics.bad_blocks.get(),
        2,
        "the read named the first"
    );
    let mut newer = std::fs::read(&files[2]).unwrap();
    let at_version = newer.len() - 16;
    newer[at_version] = 9;
    std::fs::write(&files[2], &newer).unwrap();
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    assert_eq!(store.inner.shared.metrics.bad_blocks.get(), 2);
    assert_eq!(total(&store, "app.cpu", base, base + 3_000), 0);
    let report = crate::store::check(dir.path(), &StoreConfig::default()).unwrap();
    assert_eq!(report.damaged.len(), 3, "{:?}", report.damaged);
    assert!(
        report.damaged.iter().any(|(_, e)| e.contains("version 9")),
        "{:?}",
        report.damaged
    );
}

/// A flipped byte in each section of one block, in turn (and in its head magic, its section
/// directory and its tail): the store opens, names that block (metric, `check`), serves the
/// other block, and never panics.
#[tokio::test]
async fn a_flipped_byte_in_any_section_costs_that_block_only() {
    use smolder_block::{Fetched, Footer, Tail};

    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    write(&store, vec![profile("app.cpu", base, &[("a", 1)])]).await;
    write(&store, vec![profile("app.cpu", base + 1_000, &[("b", 10)])]).await;
    store.cut(at(base + 3_000)).await.unwrap();
    let mut files = walk(&dir.path().join("blocks"));
    files.sort();
    assert_eq!(files.len(), 2);
    let good = std::fs::read(&files[0]).unwrap();
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    let tail = Tail::decode(good.len() as u64, &Fetched::whole(&good)).unwrap();
    let footer = Footer::decode(&tail, &Fetched::whole(&good)).unwrap();
    let mut places: Vec<(String, u64)> = footer
        .sections()
        .into_iter()
        .map(|(section, range)| (section.to_string(), (range.start + range.end) / 2))
        .collect();
    let directory = tail.directory_range();
    places.push(("head".into(), 0));
    places.push(("section directory".into(), directory.start + 1));
    places.push(("tail".into(), good.len() as u64 - 4));
    assert!(places.len() >= 9, "{places:?}");
    let mut store = store;
    for (section, at_byte) in places {
        let mut bad = good.clone();
        bad[at_byte as usize] ^= 0x10;
        std::fs::write(&files[0], &bad).unwrap();
        store = reopen(store, dir.path(), StoreConfig::default()).await;
        // The head magic is outside every checksum and no ranged read fetches it: the
        // block's data is intact and served; `check` still names it.
        let expected = if section == "head" { 11 } else { 10 };
        assert_eq!(
            total(&store, "app.cpu", base, base + 3_000),
            expected,
            "{section}: the other block is served, the damaged one skipped"
        );
        assert!(
            section == "head" || store.inner.shared.metrics.bad_blocks.get() >= 1,
            "{section}: counted"
        );
        let report = crate::store::check(dir.path(), &StoreConfig::default()).unwrap();
        assert_eq!(report.good, 1, "{section}: {:?}", report.damaged);
        assert_eq!(report.damaged.len(), 1, "{section}");
        assert!(
            report.damaged[0]
                .0
                .contains(name.trim_end_matches(".block")),
            "{section}: names {:?}, not {name}",
            report.damaged[0]
        );
    }
    std::fs::write(&files[0], &good).unwrap();
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    assert_eq!(total(&store, "app.cpu", base, base + 3_000), 11);
}

#[tokio::test]
async fn a_v01_data_directory_is_migrated_on_first_start() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/v0.1-data/sled");
    std::fs::create_dir_all(dir.path().join("sled")).unwrap();
    for file in ["conf", "db"] {
        std::fs::copy(fixture.join(file), dir.path().join("sled").join(file)).unwrap();
    }
    let config = StoreConfig {
        retention: Duration::from_secs(100 * 365 * 86_400),
        ..StoreConfig::default()
    };
    let store = open_with(dir.path(), config.clone());
    assert!(
        !dir.path().join("sled").exists(),
        "the old store is deleted once migrated"
    );
    let b = 1_700_000_000;
    let everything = |q: &str| merge(&store, q, b, b + 30_000);
    assert_eq!(
        folded(&everything(r#"app.cpu{env="prod"}"#).sum.tree),
        "main;idle 60\nmain;work 465\n"
    );
    assert_eq!(
        folded(&everything(r#"app.cpu{env="dev"}"#).sum.tree),
        "main;dev 10\n"
    );
    let dev = everything(r#"app.cpu{env="dev"}"#);
    assert_eq!(dev.sum.writes, 2);
    let mem = everything("mem.inuse_space");
    assert_eq!((mem.average.tree.total(), mem.average.writes), (400, 2));
    assert_eq!(mem.series[0].meta.units, "bytes");
    assert_eq!(folded(&everything("agent.cpu").sum.tree), "kernel;irq 9\n");
    assert_eq!(total(&store, "app.cpu", b + 500, b + 510), 2 + 2);
    assert_eq!(
        store.rules(&anonymous()).unwrap(),
        [("my_rule".to_owned(), b"{\"x\":1}".to_vec())]
    );
    let resent = BatchMarker {
        agent_id: "host-1".into(),
        sequence: 42,
        window_end: b + 5_010,
    };
    assert_eq!(
        store
            .write(
                &anonymous(),
                vec![profile("agent.cpu{hostname=h1}", b + 5_000, &[("x", 1)])],
                Some(resent)
            )
            .await
            .unwrap(),
        Written::Duplicate,
        "a batch stored before the upgrade is still stored once"
    );
    let report = crate::store::check(dir.path(), &config).unwrap();
    assert!(report.damaged.is_empty());
    assert_eq!(report.good, 2, "two 10 000 s ranges");
    let store = reopen(store, dir.path(), config).await;
    assert_eq!(
        folded(&everything_after(&store, b)),
        "main;idle 60\nmain;work 465\n"
    );
}

fn everything_after(store: &BlockStore, b: u64) -> Tree {
    merge(store, r#"app.cpu{env="prod"}"#, b, b + 30_000)
        .sum
        .tree
}

#[tokio::test]
async fn a_torn_record_at_the_end_of_a_head_log_is_cut_off_and_the_rest_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    write(&store, vec![profile("app.cpu", base, &[("a", 1)])]).await;
    write(&store, vec![profile("app.cpu", base + 10, &[("b", 2)])]).await;
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    store.close().await.unwrap();
    drop(store);
    // As if the process died halfway through appending a third write.
    let log = dir
        .path()
        .join(format!("head/log/{:012}.log", plan::head_range(base)));
    let mut bytes = std::fs::read(&log).unwrap();
    let good = bytes.len();
    bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3]);
    std::fs::write(&log, &bytes).unwrap();
    let store = open(dir.path());
    assert_eq!(
        folded(&merge(&store, "app.cpu", base, base + 20).sum.tree),
        "a 1\nb 2\n"
    );
    assert_eq!(std::fs::metadata(&log).unwrap().len(), good as u64);
    write(&store, vec![profile("app.cpu", base + 20, &[("c", 3)])]).await;
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    assert_eq!(total(&store, "app.cpu", base, base + 30), 6);
    store.cut(at(base + 2_000)).await.unwrap();
    assert!(!log.exists(), "a cut deletes its range's log");
}

#[tokio::test]
async fn a_write_queued_with_a_cut_of_its_range_is_not_lost_to_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    write(&store, vec![profile("app.cpu", base, &[("a", 1)])]).await;
    // The write and the cut land in one group of the writer.
    let late = store.write(
        &anonymous(),
        vec![profile("app.cpu", base + 10, &[("b", 2)])],
        None,
    );
    let cut = store.cut(at(base + 2_000));
    let (late, cut) = tokio::join!(late, cut);
    late.unwrap();
    cut.unwrap();
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    store.cut(at(base + 2_000)).await.unwrap();
    assert_eq!(total(&store, "app.cpu", base, base + 20), 3);
}

/// A cut seals its ranges, builds their blocks off the writer and publishes them: a write for
/// a sealed range and an app deletion that land between the two are kept, counted once and
/// hidden, before and after the publication and after a restart.
#[tokio::test]
async fn writes_and_deletions_during_a_cut_are_kept_once() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    write(
        &store,
        vec![
            profile("app.cpu", base, &[("a", 1)]),
            profile("other.cpu", base, &[("o", 5)]),
        ],
    )
    .await;
    let now = at(base + 2_000);
    let sealed = store
        .ask(move |reply| Command::Seal { now, reply })
        .await
        .unwrap();
    assert_eq!(sealed.len(), 1);
    // While the block is built: a write for the sealed range, and a deletion.
    write(&store, vec![profile("app.cpu", base + 10, &[("b", 2)])]).await;
    assert_eq!(
        store.delete_app(&anonymous(), "other.cpu").await.unwrap(),
        1
    );
    assert_eq!(total(&store, "app.cpu", base, base + 20), 3);
    assert_eq!(total(&store, "other.cpu", base, base + 20), 0);
    let shared = &store.inner.shared;
    let blocks = sealed
        .iter()
        .map(|s| Arc::new(cut::write_block(shared, &s.tenant, s.start, &s.range).unwrap()))
        .collect();
    let start = sealed[0].start;
    let published = store
        .ask(move |reply| Command::PublishCut {
            start,
            blocks,
            reply,
        })
        .await
        .unwrap();
    assert_eq!(published, 1);
    assert_eq!(block_count(&store), 1);
    assert_eq!(total(&store, "app.cpu", base, base + 20), 3);
    assert_eq!(total(&store, "other.cpu", base, base + 20), 0);
    // The late write stayed in the head, in its range's log.
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    assert_eq!(total(&store, "app.cpu", base, base + 20), 3);
    assert_eq!(total(&store, "other.cpu", base, base + 20), 0);
    assert_eq!(store.cut(now).await.unwrap(), 1);
    assert_eq!(store.inner.shared.state().head.series_count(), 0);
    assert_eq!(block_count(&store), 2);
    assert_eq!(total(&store, "app.cpu", base, base + 20), 3);
    assert_eq!(total(&store, "other.cpu", base, base + 20), 0);
}

/// A parent with more children than a short list holds finds them through the head's map, in
/// every later write too: each stack is summed into one node.
#[tokio::test]
async fn wide_parents_in_the_head_sum_each_child_once() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    let stacks: Vec<String> = (0..30).map(|i| format!("main;f{i};leaf")).collect();
    for round in 0..3u64 {
        let profiles = stacks
            .iter()
            .take(4 + 13 * round as usize)
            .map(|stack| profile("app.cpu", base + 10 * round, &[(stack.as_str(), 1)]))
            .collect();
        write(&store, profiles).await;
    }
    let mut expected = Tree::new();
    for round in 0..3usize {
        for stack in stacks.iter().take(4 + 13 * round) {
            expected.insert_names(stack.split(';'), 1);
        }
    }
    let read = merge(&store, "app.cpu", base, base + 30).sum.tree;
    assert_eq!(folded(&read), folded(&expected));
    store.cut(at(base + 2_000)).await.unwrap();
    let read = merge(&store, "app.cpu", base, base + 30).sum.tree;
    assert_eq!(folded(&read), folded(&expected));
}

/// A cut whose block is durable but whose writes cannot leave the head's log (its directory
/// made immutable, which even root cannot write): the block is published anyway, once, and
/// neither the next pass nor a restart counts its writes a second time.
#[tokio::test]
async fn a_cut_whose_log_cannot_be_trimmed_publishes_its_block_once() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let store = open(dir.path());
    write(
        &store,
        vec![profile("app.cpu", base, &[("a", 1), ("b", 2)])],
    )
    .await;
    let log = walk(dir.path())
        .into_iter()
        .filter_map(|file| file.parent().map(Path::to_path_buf))
        .find(|parent| parent.file_name().is_some_and(|name| name == "log"))
        .expect("the head has a log directory");
    let chattr = |flag: &str| {
        let status = std::process::Command::new("chattr")
            .arg(flag)
            .arg(&log)
            .status()
            .expect("chattr runs");
        assert!(status.success(), "chattr {flag} {}", log.display());
    };
    chattr("+i");
    let cut = store.cut(at(base + 2_000)).await;
    chattr("-i");
    assert_eq!(cut.unwrap(), 1, "the block is published");
    assert_eq!(block_count(&store), 1);
    assert_eq!(total(&store, "app.cpu", base, base + 100), 3);
    store.cut(at(base + 2_000)).await.unwrap();
    assert_eq!(block_count(&store), 1, "the next pass builds nothing again");
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    assert_eq!(block_count(&store), 1);
    assert_eq!(total(&store, "app.cpu", base, base + 100), 3);
    assert!(
        store.inner.shared.wal.records().unwrap().is_empty(),
        "replay dropped the writes the block holds"
    );
}

//! The block store through the store's interface, on real directories: the head, cuts,
//! compaction, downsampling, retention, crashes simulated at each step, damaged blocks and the
//! migration of a v0.1 data directory.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use smolder_common::{
    Aggregation, Profile, ProfileMeta, Selector, Series, SpanId, SpanTrees, Tree,
};

use super::*;
use crate::metrics::Metrics;
use crate::store::BUCKET;

/// Crashes and races: what a restart or a concurrent cut must not lose or count twice.
mod crash;
/// Damaged blocks: named, skipped, the rest served.
mod damage;

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
    store
        .write(&anonymous(), profiles, Vec::new(), None)
        .await
        .unwrap();
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
    let send = |store: &BlockStore, sequence| {
        store.write(&anonymous(), batch(), Vec::new(), Some(marker(sequence)))
    };
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
        .enforce_retention(at(base + 100 * 86_400), true)
        .await
        .unwrap();
    assert_eq!(
        report.markers, 2,
        "retention forgets markers with their data"
    );
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
            .write(&anonymous(), batch.clone(), Vec::new(), Some(late.clone()))
            .await
            .unwrap(),
        Written::Stored
    );
    assert_eq!(total(&store, "app.cpu", base, base + 100_000), 110);
    store.cut(at(now + 10)).await.unwrap();
    assert_eq!(block_count(&store), 2);
    assert_eq!(total(&store, "app.cpu", base, base + 100_000), 110);
    assert_eq!(
        store
            .write(&anonymous(), batch, Vec::new(), Some(late))
            .await
            .unwrap(),
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
        .enforce_retention(at(base + 30 * 86_400 + 10_000), true)
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
    store
        .enforce_retention(SystemTime::now(), true)
        .await
        .unwrap();
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
    // Deleted as of base + 6 000: everything of the app before that goes.
    let deleted =
        |store: &BlockStore| store.delete_app_at(&anonymous(), "app.cpu", at(base + 6_000));
    assert_eq!(deleted(&store).await.unwrap(), 2);
    assert_eq!(total(&store, "app.cpu", base, base + 10_000), 0);
    assert_eq!(total(&store, "other.cpu", base, base + 10_000), 1);
    let apps = store.apps(&anonymous()).unwrap();
    assert_eq!(
        apps.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
        ["other.cpu"]
    );
    // Nothing of it left to delete: the caller hears of no such app.
    assert_eq!(deleted(&store).await.unwrap(), 0);
    // Data of the app stamped from the horizon on shows; data stamped before it, arriving
    // late (a spool's backlog), is deleted too.
    write(
        &store,
        vec![
            profile("app.cpu", base + 7_000, &[("new", 5)]),
            profile("app.cpu", base + 1_000, &[("late", 3)]),
        ],
    )
    .await;
    assert_eq!(total(&store, "app.cpu", base, base + 10_000), 5);
    store.cut(at(base + 20_000)).await.unwrap();
    assert_eq!(total(&store, "app.cpu", base, base + 10_000), 5);
    // Through a restart (the deletion is in the database), later late data, and compaction.
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    assert_eq!(total(&store, "app.cpu", base, base + 10_000), 5);
    write(
        &store,
        vec![profile("app.cpu", base + 2_000, &[("later", 4)])],
    )
    .await;
    assert_eq!(total(&store, "app.cpu", base, base + 10_000), 5);
    store.cut(at(base + 20_000)).await.unwrap();
    store.compact(at(base + 20_000)).await.unwrap();
    assert_eq!(block_count(&store), 1);
    assert_eq!(
        folded(&merge(&store, "app.cpu", base, base + 10_000).sum.tree),
        "new 5\n"
    );
    assert_eq!(total(&store, "other.cpu", base, base + 10_000), 1);
    let block = Arc::clone(store.inner.shared.state().blocks.all().next().unwrap());
    assert_eq!(
        block.deletions,
        [smolder_block::Deletion {
            app: "app.cpu".into(),
            horizon: base + 6_000
        }],
        "the merge lists the deletion it applied"
    );
    assert!(
        store.inner.shared.state().blocks.hidden.is_empty(),
        "and holds nothing of the app to hide"
    );
    let stored = store.inner.shared.wal.deletions().unwrap();
    assert_eq!(stored, [(anonymous(), "app.cpu".to_owned(), base + 6_000)]);
    // Retention forgets the deletion once every block it could remove data from is gone.
    let later = base + 10_000 + StoreConfig::default().retention.as_secs() + 86_400;
    store.enforce_retention(at(later), true).await.unwrap();
    assert_eq!(block_count(&store), 0);
    assert!(store.inner.shared.wal.deletions().unwrap().is_empty());
    assert_eq!(store.inner.shared.state().deletions.len(), 0);
}

/// A block lists the deletions it was built with, and a store that finds it (a copy of the
/// block directory here; another aggregator's block in a bucket) learns them: late data of the
/// app stamped before the horizon is deleted there too, later data shows.
#[tokio::test]
async fn a_block_that_lists_a_deletion_teaches_it() {
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let base = base();
    let store = open(first.path());
    write(
        &store,
        vec![
            profile("app.cpu", base, &[("a", 1)]),
            profile("kept.cpu", base, &[("k", 2)]),
        ],
    )
    .await;
    let horizon = base + 5_000;
    assert_eq!(
        store
            .delete_app_at(&anonymous(), "app.cpu", at(horizon - 3))
            .await
            .unwrap(),
        1
    );
    assert_eq!(store.cut(at(base + 2_000)).await.unwrap(), 1);
    store.close().await.unwrap();
    drop(store);
    let from = first.path().join("blocks");
    let to = second.path().join("blocks");
    for tenant in std::fs::read_dir(&from).unwrap() {
        let tenant = tenant.unwrap();
        std::fs::create_dir_all(to.join(tenant.file_name())).unwrap();
        for block in std::fs::read_dir(tenant.path()).unwrap() {
            let block = block.unwrap();
            std::fs::copy(
                block.path(),
                to.join(tenant.file_name()).join(block.file_name()),
            )
            .unwrap();
        }
    }

    let store = open(second.path());
    assert!(store.inner.shared.wal.deletions().unwrap().is_empty());
    assert_eq!(
        store
            .inner
            .shared
            .state()
            .deletions
            .horizon(&anonymous(), "app.cpu"),
        Some(horizon)
    );
    write(
        &store,
        vec![
            profile("app.cpu", base + 100, &[("late", 3)]),
            profile("app.cpu", horizon, &[("new", 4)]),
        ],
    )
    .await;
    assert_eq!(total(&store, "app.cpu", base, base + 10_000), 4);
    assert_eq!(total(&store, "kept.cpu", base, base + 10_000), 2);
}

/// An app deleted that goes on pushing: its block, downsampled, has a 100 s bucket straddling
/// the horizon that holds only data stamped after it, which stays through the merge with late
/// data that follows.
#[tokio::test]
async fn data_after_a_deletion_stays_through_downsampling_and_a_later_merge() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let config = StoreConfig {
        downsample_to_100s_after: Duration::from_secs(3_600),
        ..StoreConfig::default()
    };
    let store = open_with(dir.path(), config);
    write(
        &store,
        vec![
            profile("app.cpu", base + 100, &[("old", 1)]),
            profile("app.cpu", base + 540, &[("old", 2)]),
        ],
    )
    .await;
    let horizon = base + 550;
    assert_eq!(
        store
            .delete_app_at(&anonymous(), "app.cpu", at(horizon - 5))
            .await
            .unwrap(),
        1
    );
    write(
        &store,
        vec![
            profile("app.cpu", base + 560, &[("new", 4)]),
            profile("app.cpu", base + 590, &[("new", 8)]),
            profile("app.cpu", base + 700, &[("new", 16)]),
        ],
    )
    .await;
    let now = base + 100_000;
    store.cut(at(now)).await.unwrap();
    store.compact(at(now + 3_600)).await.unwrap();
    {
        let blocks = Arc::clone(&store.inner.shared.state().blocks);
        let block = blocks.all().next().unwrap();
        assert_eq!(block.finest(), 100);
        assert_eq!(block.listed("app.cpu"), Some(horizon));
    }
    assert_eq!(total(&store, "app.cpu", base, base + 1_000), 28);
    // Late data of the range: after the horizon it shows, before it it is deleted.
    write(
        &store,
        vec![
            profile("app.cpu", base + 800, &[("late", 32)]),
            profile("app.cpu", base + 540, &[("late", 64)]),
        ],
    )
    .await;
    store.cut(at(now + 3_610)).await.unwrap();
    assert_eq!(block_count(&store), 2);
    assert_eq!(total(&store, "app.cpu", base, base + 1_000), 60);
    store.compact(at(now + 3_610)).await.unwrap();
    assert_eq!(block_count(&store), 1);
    assert_eq!(
        folded(&merge(&store, "app.cpu", base, base + 1_000).sum.tree),
        "late 32\nnew 28\n"
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
            Vec::new(),
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
        store.write(&anonymous(), vec![], Vec::new(), None).await,
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
                .write(tenant, batch.clone(), Vec::new(), Some(marker.clone()))
                .await
                .unwrap(),
            Written::Stored,
            "{tenant}"
        );
        assert_eq!(
            store
                .write(tenant, batch, Vec::new(), Some(marker.clone()))
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
                Vec::new(),
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

/// Span `n`'s id.
fn span(n: u64) -> SpanId {
    SpanId::from_bytes(n.to_be_bytes()).unwrap()
}

/// The samples of `spans` in `query`'s series over `from..until`, folded.
fn span_profile(
    store: &BlockStore,
    query: &str,
    (from, until): (u64, u64),
    spans: &[SpanId],
) -> String {
    let merged = store
        .merge_spans(&anonymous(), &selector(query), range(from, until), spans)
        .unwrap();
    folded(&merged.sum.tree)
}

/// A profile with two spans (`2i + 1` running `alpha` and `2i + 2` running `beta`) and samples
/// in no span, with its span trees.
fn spanned(series: &str, from: u64, i: u64) -> (Profile, SpanTrees) {
    let profile = profile(
        series,
        from,
        &[("main;alpha", 3), ("main;beta", 2), ("main;idle", 1)],
    );
    let mut spans = SpanTrees::new();
    spans
        .tree_mut(span(2 * i + 1))
        .insert_names(["main", "alpha"], 3);
    spans
        .tree_mut(span(2 * i + 2))
        .insert_names(["main", "beta"], 2);
    (profile, spans)
}

#[tokio::test]
async fn span_profiles_read_the_same_from_the_head_cuts_merges_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let base = base();
    // 30 writes 70 s apart: three head ranges.
    for i in 0..30u64 {
        let (profile, spans) = spanned("app.cpu", base + i * 70, i);
        store
            .write(&anonymous(), vec![profile], vec![(0, spans)], None)
            .await
            .unwrap();
    }
    let all = (base, base + 3_000);
    let check = |store: &BlockStore, step: &str| {
        for i in [0u64, 13, 29] {
            assert_eq!(
                span_profile(store, "app.cpu", all, &[span(2 * i + 1)]),
                "main;alpha 3\n",
                "{step}: span {i}"
            );
            assert_eq!(
                span_profile(store, "app.cpu", all, &[span(2 * i + 1), span(2 * i + 2)]),
                "main;alpha 3\nmain;beta 2\n",
                "{step}"
            );
            let when = base + i * 70;
            assert_eq!(
                span_profile(store, "app.cpu", (when, when + 10), &[span(2 * i + 2)]),
                "main;beta 2\n",
                "{step}: the span's own bucket"
            );
            assert_eq!(
                span_profile(store, "app.cpu", (when + 10, when + 70), &[span(2 * i + 2)]),
                "",
                "{step}: outside the span's bucket"
            );
        }
        let odd: Vec<SpanId> = (0..30).map(|i| span(2 * i + 1)).collect();
        let merged = store
            .merge_spans(
                &anonymous(),
                &selector("app.cpu"),
                range(all.0, all.1),
                &odd,
            )
            .unwrap();
        assert_eq!(folded(&merged.sum.tree), "main;alpha 90\n", "{step}");
        assert_eq!(merged.series.len(), 1, "{step}");
        assert_eq!(span_profile(store, "other.cpu", all, &odd), "", "{step}");
        assert_eq!(
            span_profile(store, "app.cpu", all, &[span(999)]),
            "",
            "{step}"
        );
        // The series' own profile is every sample, span or not.
        assert_eq!(total(store, "app.cpu", all.0, all.1), 30 * 6, "{step}");
    };
    check(&store, "head");
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    check(&store, "head replayed from its log");
    let now = base + 3_000 + plan::CUT_GRACE;
    assert_eq!(store.cut(at(now)).await.unwrap(), 3);
    check(&store, "cut");
    let report = store.compact(at(base + 200_000)).await.unwrap();
    assert!(report.merged >= 1, "{report:?}");
    assert_eq!(block_count(&store), 1);
    check(&store, "compacted");
    let store = reopen(store, dir.path(), StoreConfig::default()).await;
    check(&store, "reopened");
    let blocks = Arc::clone(&store.inner.shared.state().blocks);
    let block = blocks.all().next().unwrap();
    let bytes = block.read(0..block.len).unwrap();
    let report = smolder_block::verify(&bytes, &smolder_block::Limits::default()).unwrap();
    assert_eq!(report.spans, 60, "every span tree in the compacted block");
}

#[tokio::test]
async fn span_trees_past_the_cap_are_dropped_largest_kept_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let base = base();
    let metrics = Metrics::new();
    let config = StoreConfig {
        max_spans_per_bucket: 3,
        ..StoreConfig::default()
    };
    let store = BlockStore::open(
        dir.path(),
        config.clone(),
        StoreMetrics::new(metrics.registry(), &metrics.health),
    )
    .unwrap();
    let mut spans = SpanTrees::new();
    let mut stacks = Vec::new();
    for n in 1..=5u64 {
        spans.tree_mut(span(n)).insert_names(["main", "work"], n);
        stacks.push(n);
    }
    let profile = profile("app.cpu", base, &[("main;work", stacks.iter().sum())]);
    store
        .write(
            &anonymous(),
            vec![profile.clone()],
            vec![(0, spans.clone())],
            None,
        )
        .await
        .unwrap();
    // A second write in the same bucket has no room left; a new bucket has.
    let mut later = profile.clone();
    (later.from, later.until) = (at(base + 10), at(base + 20));
    for (from, p) in [(base, profile), (base + 10, later)] {
        let mut one = SpanTrees::new();
        one.tree_mut(span(100 + from % 100))
            .insert_names(["main", "work"], 50);
        store
            .write(&anonymous(), vec![p], vec![(0, one)], None)
            .await
            .unwrap();
    }
    let every: Vec<SpanId> = (1..=5).map(span).chain([span(100), span(110)]).collect();
    let check = |store: &BlockStore, step: &str| {
        let kept: Vec<u64> = every
            .iter()
            .filter(|s| !span_profile(store, "app.cpu", (base, base + 30), &[**s]).is_empty())
            .map(|s| u64::from_str_radix(&s.to_string(), 16).unwrap())
            .collect();
        assert_eq!(
            kept,
            [3, 4, 5, 110],
            "{step}: the three largest of the first bucket"
        );
        assert_eq!(
            total(store, "app.cpu", base, base + 30),
            3 * 15,
            "{step}: samples stay"
        );
    };
    check(&store, "head");
    let text = metrics.render().unwrap();
    assert!(
        text.contains(
            "smolder_aggregator_dropped_spans_total{intentional=\"true\",reason=\"span_limit\",stage=\"store\"} 3"
        ),
        "{text}"
    );
    assert!(
        text.contains("smolder_aggregator_store_span_trees_written_total 4"),
        "{text}"
    );
    let store = reopen(store, dir.path(), config).await;
    check(&store, "replayed");
    store.cut(at(base + 1_000 + plan::CUT_GRACE)).await.unwrap();
    check(&store, "cut");
}

#[tokio::test]
async fn a_head_over_its_memory_budget_is_cut_early_and_counts_every_write_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        head_max_bytes: 64 << 10,
        ..StoreConfig::default()
    };
    let store = open_with(dir.path(), config.clone());
    let base = base();
    // One open head range (not due before base + 1000 + the cut's grace), written in two
    // rounds: each round alone is over the budget.
    // 200 writes of 20 stacks each (210 samples), over the range's first 900 s.
    let round = |first: u64| {
        (first..first + 200).map(move |i| {
            let stacks: Vec<(String, u64)> = (0..20)
                .map(|f| (format!("main;handler{};leaf{f}", i % 7), f + 1))
                .collect();
            let stacks: Vec<(&str, u64)> = stacks.iter().map(|(s, v)| (s.as_str(), *v)).collect();
            profile("app.cpu", base + (i % 90) * 10, &stacks)
        })
    };
    for profile in round(0) {
        write(&store, vec![profile]).await;
    }
    let mut expected = 200 * 210;
    let head = || store.inner.shared.state().head.bytes();
    assert!(
        head() > 64 << 10,
        "the round fills the head past its budget: {}",
        head()
    );
    let not_due = at(base + 100);
    let logs = dir.path().join("head/log");
    let log_bytes = || {
        walk(&logs)
            .iter()
            .map(|f| f.metadata().unwrap().len())
            .sum::<u64>()
    };
    assert!(log_bytes() > 0);
    assert!(store.cut(not_due).await.unwrap() >= 1, "cut early");
    assert!(head() <= 32 << 10, "what is left of the head: {}", head());
    // Its log went aside with it and is gone with the cut, not read back.
    assert_eq!(walk(&logs), Vec::<std::path::PathBuf>::new());
    assert_eq!(store.inner.shared.metrics.ranges_sealed_early.get(), 1);
    assert_eq!(total(&store, "app.cpu", base, base + 1_000), expected);
    // Later writes to the same range start it again, and are cut early again.
    for profile in round(200) {
        write(&store, vec![profile]).await;
    }
    expected += 200 * 210;
    assert_eq!(total(&store, "app.cpu", base, base + 1_000), expected);
    assert!(store.cut(not_due).await.unwrap() >= 1);
    assert_eq!(total(&store, "app.cpu", base, base + 1_000), expected);
    assert!(block_count(&store) >= 2, "a block per early cut");
    assert_eq!(log_bytes(), 0);
    // Writes after the cut stay in the range's open log, and a restart replays them alone.
    for profile in round(400).take(10) {
        write(&store, vec![profile]).await;
    }
    expected += 10 * 210;
    assert!(log_bytes() > 0);
    // Restarted, it replays only what no block holds.
    let store = reopen(store, dir.path(), config).await;
    assert_eq!(total(&store, "app.cpu", base, base + 1_000), expected);
    // Closed, the range's last writes are cut as usual, and compaction merges its blocks.
    let now = base + 1_000 + plan::CUT_GRACE;
    store.cut(at(now)).await.unwrap();
    assert_eq!(store.inner.shared.state().head.series_count(), 0);
    assert_eq!(total(&store, "app.cpu", base, base + 1_000), expected);
    let report = store
        .compact(at(base + 10_000 + plan::COMPACTION_GRACE))
        .await
        .unwrap();
    assert!(report.merged >= 1, "{report:?}");
    assert_eq!(total(&store, "app.cpu", base, base + 1_000), expected);
}

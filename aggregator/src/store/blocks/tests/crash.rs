//! Crashes simulated between the steps of a cut or a merge, a torn head log, a log that cannot
//! be trimmed, and writes and deletions racing a cut: each batch counted once, nothing lost.

use super::*;

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
            Vec::new(),
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
        Vec::new(),
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

//! Damaged blocks: a block that cannot be read is named (log, metric, `check`) and skipped,
//! and the rest is served; a flipped byte in any section costs that block only.

use super::*;

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

//! The cache format: real and random tables round-trip through bytes and files; damaged,
//! truncated, oversized or foreign bytes give an error, never a panic or a huge allocation.

use std::path::Path;

use proptest::prelude::*;
use smolder_unwind::{
    Cfa, ExeId, Fp, Limits, Rule, Stats, Unsupported, UnwindError, UnwindTable, cache,
};

use crate::util::table_of;

fn rule() -> impl Strategy<Value = Rule> {
    let fp = prop_oneof![
        Just(Fp::Same),
        any::<i16>().prop_map(Fp::AtCfa),
        Just(Fp::Lost)
    ];
    let cfa = prop_oneof![
        (0u32..=0xffff).prop_map(Cfa::Rsp),
        (0x2000u32..0xffff).prop_map(|x| Cfa::Rsp(x * 8)),
        any::<u16>().prop_map(Cfa::Rbp),
        Just(Cfa::Plt1),
        Just(Cfa::Plt2),
    ];
    prop_oneof![
        Just(Rule::NoFde),
        Just(Rule::Signal),
        Just(Rule::End),
        prop::sample::select(&Unsupported::ALL[..]).prop_map(Rule::Unsupported),
        (cfa, fp).prop_map(|(cfa, fp)| Rule::Frame { cfa, fp }),
        (any::<u16>(), any::<i16>()).prop_map(|(offset, add)| Rule::Frame {
            cfa: Cfa::DerefRsp { offset, add },
            fp: Fp::Same
        }),
    ]
}

/// Random tables: rows at increasing addresses, some close together, some pages apart.
fn table() -> impl Strategy<Value = UnwindTable> {
    let id = prop_oneof![
        (
            prop::collection::vec(any::<u8>(), 1..=64),
            any::<[u8; 16]>()
        )
            .prop_map(|(id, digest)| ExeId::BuildId(id, digest)),
        any::<[u8; 32]>().prop_map(ExeId::ContentHash),
    ];
    let gaps = prop::collection::vec((prop_oneof![1u64..64, 1u64..0x30000], rule()), 1..300);
    (id, any::<u32>(), gaps, any::<[u64; 4]>()).prop_map(|(id, base, gaps, unsupported)| {
        let mut pc = u64::from(base);
        let rows: Vec<(u64, Rule)> = gaps
            .into_iter()
            .map(|(gap, rule)| {
                pc += gap;
                (pc, rule)
            })
            .collect();
        let stats = Stats {
            fdes: rows.len() as u64,
            unsupported,
            ..Stats::default()
        };
        UnwindTable::from_rows(id, &rows, stats, &Limits::default()).expect("a valid table")
    })
}

proptest! {
    #[test]
    fn tables_round_trip(table in table()) {
        let bytes = cache::encode(&table);
        prop_assert_eq!(cache::decode(&bytes, &Limits::default()).unwrap(), table);
    }

    #[test]
    fn every_byte_flip_is_an_error(table in table(), index in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut bytes = cache::encode(&table);
        let i = index.index(bytes.len());
        bytes[i] ^= 1 << bit;
        prop_assert!(cache::decode(&bytes, &Limits::default()).is_err());
    }

    #[test]
    fn truncation_is_an_error(table in table(), index in any::<prop::sample::Index>()) {
        let bytes = cache::encode(&table);
        let len = index.index(bytes.len());
        prop_assert!(cache::decode(&bytes[..len], &Limits::default()).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic(mut bytes in prop::collection::vec(any::<u8>(), 0..400), magic in any::<bool>()) {
        if magic && bytes.len() >= 12 {
            bytes[..8].copy_from_slice(&cache::MAGIC);
            bytes[8..12].copy_from_slice(&cache::VERSION.to_le_bytes());
        }
        let _ = cache::decode(&bytes, &Limits::default());
    }
}

#[test]
fn a_real_table_round_trips_through_a_file() {
    let table = table_of(Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6"));
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        cache::read(dir.path(), table.id(), &Limits::default()).unwrap(),
        None
    );
    let path = cache::write(dir.path(), &table).unwrap();
    assert_eq!(
        path.file_name().unwrap().to_str().unwrap(),
        cache::file_name(table.id())
    );
    let read = cache::read(dir.path(), table.id(), &Limits::default())
        .unwrap()
        .unwrap();
    assert_eq!(read, table);
    assert_eq!(read.stats(), table.stats());

    // A file holding another identity's table is rejected.
    let other = ExeId::BuildId(vec![0xab; 20], [0; 16]);
    std::fs::copy(&path, dir.path().join(cache::file_name(&other))).unwrap();
    let err = cache::read(dir.path(), &other, &Limits::default()).unwrap_err();
    assert!(matches!(err, UnwindError::Malformed { .. }), "{err}");
}

#[test]
fn another_version_and_oversized_counts_are_clear_errors() {
    let table = table_of(Path::new("/lib64/ld-linux-x86-64.so.2"));
    let mut bytes = cache::encode(&table);
    // Version 1 named a table by build id alone (a forged file could poison it); version 2's
    // Go tables lack the scheduler's stack roots; version 3's pages span 64 KiB: none is read.
    for old in [1u32, 2, 3] {
        bytes[8..12].copy_from_slice(&old.to_le_bytes());
        let err = cache::decode(&bytes, &Limits::default()).unwrap_err();
        assert!(
            matches!(err, UnwindError::Version { found, expected: 4 } if found == old),
            "{err}"
        );
    }
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    let err = cache::decode(&bytes, &Limits::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "unwind cache format version 1, this build reads version 4"
    );

    // An entry count past the limits is refused before anything of that size is allocated.
    let mut bytes = cache::encode(&table);
    bytes[184..192].copy_from_slice(&u64::MAX.to_le_bytes());
    let err = cache::decode(&bytes, &Limits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            UnwindError::TooLarge {
                what: "entries",
                ..
            }
        ),
        "{err}"
    );

    // Tighter limits refuse a real table that fits the defaults.
    let bytes = cache::encode(&table);
    let tight = Limits {
        max_rows: 100,
        max_pages: 4,
    };
    assert!(matches!(
        cache::decode(&bytes, &tight),
        Err(UnwindError::TooLarge { .. })
    ));
}

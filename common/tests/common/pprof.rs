//! Properties of the pprof codec: trees survive encode → decode, and no input makes the
//! decoder panic.

use std::io::Write;

use proptest::prelude::*;
use smolder_common::Tree;
use smolder_common::pprof::{self, EncodeOptions, Limits, SampleTypeConfig, SampleTypes};

/// Frame names, including ones that look like separators, empty-looking and non-ASCII ones.
const NAMES: &[&str] = &[
    "main",
    "runtime.mallocgc",
    "a b",
    "x;y",
    "ünï",
    "0x1234",
    "libc.so.6+0x10",
    " ",
    "net/http.(*conn).serve",
    "f",
];

fn stacks() -> impl Strategy<Value = Vec<(Vec<usize>, u64)>> {
    prop::collection::vec(
        (
            prop::collection::vec(0..NAMES.len(), 0..12),
            1..=1_000_000_000_000u64,
        ),
        0..40,
    )
}

fn tree_of(stacks: &[(Vec<usize>, u64)]) -> Tree {
    let mut tree = Tree::new();
    for (stack, value) in stacks {
        tree.insert_names(stack.iter().map(|&i| NAMES[i]), *value);
    }
    tree
}

fn folded(tree: &Tree) -> Vec<(Vec<String>, u64)> {
    let mut out = Vec::new();
    tree.for_each_stack(|stack, value| {
        let names = stack
            .iter()
            .map(|&f| tree.frames().name(f).to_string())
            .collect();
        out.push((names, value));
    });
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).expect("writing to a Vec");
    encoder.finish().expect("writing to a Vec")
}

/// Limits small enough that arbitrary input cannot make a test slow.
fn small() -> Limits {
    Limits {
        max_bytes: 1 << 20,
        max_samples: 10_000,
        max_entries: 10_000,
        max_stack_depth: 64,
        max_span_nodes: 10_000,
    }
}

fn valid_profile() -> Vec<u8> {
    let mut tree = Tree::new();
    tree.insert_names(["main", "handler", "json.Marshal"], 37);
    tree.insert_names(["main", "gc"], 5);
    pprof::encode(&tree, &EncodeOptions::cpu_samples(100)).to_bytes(false)
}

proptest! {
    #[test]
    fn tree_round_trips_through_pprof(stacks in stacks(), zip in any::<bool>()) {
        let tree = tree_of(&stacks);
        let options = EncodeOptions::new("wall", "nanoseconds");
        let bytes = pprof::encode(&tree, &options).to_bytes(zip);
        let mut types = SampleTypes::empty();
        types.insert("wall", SampleTypeConfig::default());
        let series = pprof::parse(&bytes, &types, &Limits::default()).expect("own output parses");
        if tree.total() == 0 {
            prop_assert!(series.is_empty());
        } else {
            prop_assert_eq!(series.len(), 1);
            prop_assert_eq!(&series[0].units, "nanoseconds");
            prop_assert_eq!(folded(&series[0].tree), folded(&tree));
            prop_assert_eq!(&series[0].tree, &tree);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = pprof::parse(&bytes, &SampleTypes::default(), &small());
        // Behind a bare gzip header: a corrupt deflate stream.
        let mut headed = vec![0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0, 0, 0xff];
        headed.extend_from_slice(&bytes);
        let _ = pprof::parse(&headed, &SampleTypes::default(), &small());
        // Validly gzipped garbage: the protobuf decoder gets it.
        let _ = pprof::parse(&gzip(&bytes), &SampleTypes::default(), &small());
    }

    #[test]
    fn mutated_profiles_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        zip in any::<bool>(),
    ) {
        let mut bytes = valid_profile();
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        let body = if zip { gzip(&bytes) } else { bytes };
        let _ = pprof::parse(&body, &SampleTypes::default(), &small());
    }
}

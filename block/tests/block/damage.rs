//! Damaged blocks: every truncation and every flipped byte is an error naming a section, a
//! newer format is refused by version, and nothing panics.

use smolder_block::{
    BlockBuilder, BlockError, Contribution, Fetched, Footer, Index, Limits, Marker, Names, Section,
    SeriesChunk, SpanChunk, SpanIndex, Tail, VERSION, verify,
};
use smolder_common::{ProfileMeta, Series, SpanId, SpanTrees, Tree};

use crate::util::START;

fn block() -> Vec<u8> {
    let mut builder = BlockBuilder::new("anonymous", START, 1_000, 10).unwrap();
    for (i, name) in ["app.cpu{env=prod}", "app.cpu{env=dev}"].iter().enumerate() {
        for bucket in 0..3u64 {
            let mut tree = Tree::new();
            tree.insert_names(["main", "handler", "work"], bucket + 1);
            tree.insert_names(["main", "gc"], 2);
            let mut spans = SpanTrees::new();
            let span = SpanId::from_bytes([0xab, 0, 0, 0, 0, 0, i as u8, bucket as u8 + 1]);
            spans
                .tree_mut(span.unwrap())
                .insert_names(["main", "handler", "work"], bucket + 1);
            let marker = Marker {
                agent_id: format!("host-{i}"),
                sequence: bucket,
            };
            builder
                .add_with_spans(
                    &Series::parse(name).unwrap(),
                    &ProfileMeta::default(),
                    START + bucket * 370,
                    &tree,
                    &spans,
                    Contribution::batch(marker, 1),
                )
                .unwrap();
        }
    }
    builder.finish().unwrap().0
}

fn footer(block: &[u8]) -> Footer {
    let fetched = Fetched::whole(block);
    let tail = Tail::decode(block.len() as u64, &fetched).unwrap();
    Footer::decode(&tail, &fetched).unwrap()
}

/// Reads everything through the ranged reader, trees and spans; errors are fine, panics are
/// not. The total of the trees and of the spans.
fn read_all(block: &[u8]) -> Result<(u64, u64), BlockError> {
    let limits = Limits::default();
    let fetched = Fetched::whole(block);
    let tail = Tail::decode(block.len() as u64, &fetched)?;
    let footer = Footer::decode(&tail, &fetched)?;
    let index = Index::decode(&footer, &fetched, &limits)?;
    let names = Names::decode(&footer, &fetched, &limits)?;
    let mut total = 0;
    for series in 0..index.series().len() {
        let chunk = SeriesChunk::decode(&index, series, &fetched, &limits)?;
        let mut tree = Tree::new();
        chunk.read_range(START, START + 1_000, &fetched, &names, &mut tree)?;
        total += tree.total();
    }
    let spans = SpanIndex::decode(&footer, &index, &fetched, &limits)?;
    let mut span_total = 0;
    for series in spans.series() {
        let chunk = SpanChunk::decode(&index, &spans, series, &fetched, &limits)?;
        let every: Vec<SpanId> = (0..chunk.entries().len())
            .map(|e| chunk.read_entry(e, &fetched))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .map(|(span, _)| span)
            .collect();
        let mut every = every;
        every.sort();
        let mut tree = Tree::new();
        chunk.read_range(START, START + 1_000, &every, &fetched, &names, &mut tree)?;
        span_total += tree.total();
    }
    Ok((total, span_total))
}

#[test]
fn every_truncation_is_an_error() {
    let block = block();
    assert_eq!(
        read_all(&block).unwrap(),
        (2 * (1 + 2 + 3 + 3 * 2), 2 * (1 + 2 + 3))
    );
    for len in 0..block.len() {
        assert!(
            verify(&block[..len], &Limits::default()).is_err(),
            "{len} bytes verified"
        );
        assert!(read_all(&block[..len]).is_err(), "{len} bytes read");
    }
}

#[test]
fn every_flipped_byte_is_an_error() {
    let block = block();
    for at in 0..block.len() {
        for mask in [0x01, 0x80, 0xff] {
            let mut bad = block.clone();
            bad[at] ^= mask;
            assert!(
                verify(&bad, &Limits::default()).is_err(),
                "byte {at} ^ {mask:#x} verified"
            );
            // The reader may not notice a flip in bytes it does not read, but it never panics.
            let _ = read_all(&bad);
        }
    }
}

#[test]
fn a_flipped_byte_names_its_section() {
    let block = block();
    let sections = footer(&block).sections();
    assert_eq!(
        sections.len(),
        8,
        "six required sections, spans and the span index"
    );
    for (section, range) in sections {
        let mut bad = block.clone();
        bad[(range.start + range.end) as usize / 2] ^= 0x10;
        let err = verify(&bad, &Limits::default()).unwrap_err();
        assert!(
            matches!(err, BlockError::Checksum { section: s, .. } if s == section),
            "{section}: {err}"
        );
        assert!(err.to_string().starts_with(&section.to_string()), "{err}");
    }
    // Through the ranged reader, a damaged tree names itself.
    let trees = footer(&block).trees_range();
    let mut bad = block.clone();
    bad[trees.end as usize - 2] ^= 0x10;
    let err = read_all(&bad).unwrap_err();
    assert!(
        matches!(
            err,
            BlockError::Checksum {
                section: Section::Tree { series: 1, .. },
                ..
            }
        ),
        "{err}"
    );
    // A damaged span entry names itself, and the trees still read.
    let spans = footer(&block)
        .sections()
        .into_iter()
        .find(|(section, _)| *section == Section::Spans)
        .unwrap()
        .1;
    let mut bad = block.clone();
    bad[spans.end as usize - 2] ^= 0x10;
    let err = read_all(&bad).unwrap_err();
    assert!(
        matches!(
            err,
            BlockError::Checksum {
                section: Section::SpanEntry { series: 1, .. },
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string().split(':').next(),
        Some("span entry 2 of series 1")
    );
    // And the head and the directory.
    let mut bad = block.clone();
    bad[0] ^= 1;
    assert_eq!(
        verify(&bad, &Limits::default()).unwrap_err(),
        BlockError::BadMagic {
            section: Section::Head
        }
    );
    let directory = Tail::decode(block.len() as u64, &Fetched::whole(&block))
        .unwrap()
        .directory_range();
    let mut bad = block.clone();
    bad[directory.start as usize + 1] ^= 1;
    assert!(matches!(
        verify(&bad, &Limits::default()).unwrap_err(),
        BlockError::Checksum {
            section: Section::Directory,
            ..
        }
    ));
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn varint(bytes: &[u8], at: &mut usize) -> u64 {
    let mut value = 0;
    let mut shift = 0;
    loop {
        let byte = bytes[*at];
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return value;
        }
        shift += 7;
    }
}

/// `block` with one more section of `kind` holding `payload`, written as ARCHITECTURE.md
/// documents the directory and tail.
fn with_section(block: &[u8], kind: u8, required: bool, payload: &[u8]) -> Vec<u8> {
    let tail = &block[block.len() - 32..];
    let dir_start = u64::from_le_bytes(tail[0..8].try_into().unwrap()) as usize;
    let dir_len = u32::from_le_bytes(tail[8..12].try_into().unwrap()) as usize;
    let dir = &block[dir_start..dir_start + dir_len];
    let mut at = 0;
    let count = varint(dir, &mut at);
    let entries = &dir[at..];
    let mut out = block[..dir_start].to_vec();
    let offset = out.len() as u64;
    out.extend_from_slice(payload);
    let new_start = out.len() as u64;
    let mut directory = Vec::new();
    put_varint(&mut directory, count + 1);
    directory.extend_from_slice(entries);
    directory.push(kind);
    directory.push(u8::from(required));
    directory.push(0);
    put_varint(&mut directory, offset);
    put_varint(&mut directory, payload.len() as u64);
    put_varint(&mut directory, payload.len() as u64);
    directory.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(&directory);
    out.extend_from_slice(&new_start.to_le_bytes());
    out.extend_from_slice(&(directory.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&directory).to_le_bytes());
    out.extend_from_slice(&tail[16..]);
    out
}

#[test]
fn newer_formats_are_refused_by_version_or_section() {
    let block = block();
    let mut newer = block.clone();
    let at = newer.len() - 16;
    newer[at..at + 2].copy_from_slice(&(VERSION + 1).to_le_bytes());
    let err = verify(&newer, &Limits::default()).unwrap_err();
    assert_eq!(
        err,
        BlockError::UnsupportedVersion {
            found: VERSION + 1,
            supported: VERSION
        }
    );
    assert_eq!(
        err.to_string(),
        "block format version 2 is not readable by this build (it reads 1 to 1)"
    );

    let required = with_section(&block, 99, true, b"new");
    assert_eq!(
        verify(&required, &Limits::default()).unwrap_err(),
        BlockError::UnknownRequiredSection { kind: 99 }
    );
    // An optional section of a newer format is skipped, as readers that predate the spans
    // sections (kinds 16 and 17) skip those.
    let optional = with_section(&block, 30, false, b"newer data");
    verify(&optional, &Limits::default()).unwrap();
    assert_eq!(read_all(&optional).unwrap(), read_all(&block).unwrap());
    assert!(
        footer(&optional)
            .sections()
            .iter()
            .any(
                |(section, range)| *section == Section::Optional { kind: 30 }
                    && range.end - range.start == 10
            )
    );
}

#[test]
fn limits_cap_what_a_reader_allocates() {
    let block = block();
    let tiny = Limits {
        max_section_bytes: 8,
    };
    let err = verify(&block, &tiny).unwrap_err();
    assert!(
        matches!(
            err,
            BlockError::TooLarge { .. } | BlockError::Decompress { .. }
        ),
        "{err}"
    );
}

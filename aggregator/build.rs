//! Embeds the web UI's built assets (`aggregator/ui/dist`, made by `npm run build`) into the
//! binary, each with a gzipped copy, so that the aggregator serves the UI with no second server
//! and no files beside it.
//!
//! Node is not needed to build the aggregator: when `dist/index.html` does not exist, the
//! generated table is empty and `/` explains how to build the UI (see `src/ui.rs`).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::{env, fs};

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    let ui = manifest.join("ui");
    let dist = ui.join("dist");

    let mut files = Vec::new();
    if dist.join("index.html").is_file() {
        println!("cargo::rerun-if-changed={}", dist.display());
        collect(&dist, &mut files);
        files.sort();
    } else {
        // Without a build, watch the UI folder so that a later `npm run build` (which creates
        // `dist/`) is picked up; a missing path would make cargo rerun this script every time.
        println!("cargo::rerun-if-changed={}", ui.display());
    }

    let mut table = String::from("&[\n");
    for (i, file) in files.iter().enumerate() {
        let relative = file
            .strip_prefix(&dist)
            .expect("collected under dist")
            .to_str()
            .expect("asset paths are UTF-8 (vite names them)")
            .replace('\\', "/");
        let bytes = fs::read(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let gzipped = out_dir.join(format!("ui-asset-{i}.gz"));
        fs::write(&gzipped, gzip(&bytes))
            .unwrap_or_else(|e| panic!("writing {}: {e}", gzipped.display()));
        writeln!(
            table,
            "    Asset {{ path: {path:?}, body: include_bytes!({raw:?}), gzip: include_bytes!({gz:?}) }},",
            path = format!("/{relative}"),
            raw = file.display().to_string(),
            gz = gzipped.display().to_string(),
        )
        .expect("writing to a String");
    }
    table.push(']');
    fs::write(out_dir.join("ui_assets.rs"), table).expect("writing ui_assets.rs");
}

/// Every file under `dir`, recursively.
fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("reading a directory entry").path();
        if path.is_dir() {
            collect(&path, files);
        } else {
            files.push(path);
        }
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes).expect("in memory");
    encoder.finish().expect("in memory")
}

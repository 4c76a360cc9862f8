//! Shared helpers: building tables from files, compiling C test programs.

use std::path::{Path, PathBuf};
use std::process::Command;

use smolder_unwind::{Elf, Limits, UnwindTable};

/// The table of the ELF file at `path`.
pub(crate) fn table_of(path: &Path) -> UnwindTable {
    let bytes = std::fs::read(path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
    let elf = Elf::parse(&bytes).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    smolder_unwind::build(&elf, None, &Limits::default())
        .unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// Compiles `source` (C) with gcc and `flags` into `dir/name`, returning the binary's path.
pub(crate) fn gcc(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("write the C source");
    let out = dir.join(name);
    let output = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .output()
        .expect("run gcc (apt-get install gcc)");
    assert!(
        output.status.success(),
        "gcc {flags:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

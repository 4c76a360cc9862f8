//! Compiles the kernel-side programs with clang into `$OUT_DIR/unwinder.bpf.o`, which `lib.rs`
//! embeds, and the `hook_cost` bench's empty programs into `$OUT_DIR/hook_floor.bpf.o`. `CLANG`
//! overrides the compiler; on Debian, `apt-get install clang libbpf-dev` provides it and the
//! `bpf/bpf_helpers.h` header (`scripts/test` and `scripts/run` do so).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    for file in [
        "src/unwinder.bpf.c",
        "src/unwind.bpf.h",
        "src/unwind.h",
        "src/process.h",
        "src/offcpu.h",
        "src/python.h",
        "src/python.bpf.h",
        "src/pagetable.bpf.h",
        "benches/hook_floor.bpf.c",
    ] {
        println!("cargo:rerun-if-changed={file}");
    }
    println!("cargo:rerun-if-env-changed=CLANG");
    compile(&clang, "src/unwinder.bpf.c", &out.join("unwinder.bpf.o"));
    compile(
        &clang,
        "benches/hook_floor.bpf.c",
        &out.join("hook_floor.bpf.o"),
    );
}

fn compile(clang: &str, source: &str, object: &Path) {
    // -g keeps BTF, which aya needs for BTF-defined maps; -Werror keeps the contract warning-free.
    let status = Command::new(clang)
        .args([
            "-target",
            "bpf",
            "-O2",
            "-g",
            "-Wall",
            "-Werror",
            "-D__TARGET_ARCH_x86",
            "-I/usr/include/x86_64-linux-gnu",
            "-c",
            source,
            "-o",
        ])
        .arg(object)
        .status()
        .unwrap_or_else(|err| {
            panic!(
                "running {clang} to compile the eBPF programs failed: {err}; \
                 install it with `apt-get install clang libbpf-dev` or set CLANG"
            )
        });
    assert!(
        status.success(),
        "{clang} failed to compile {source} ({status})"
    );
}

//! Compiles the kernel-side sampler with clang into `$OUT_DIR/sampler.bpf.o`, which `lib.rs`
//! embeds. `CLANG` overrides the compiler; on Debian, `apt-get install clang libbpf-dev` provides
//! it and the `bpf/bpf_helpers.h` header (`scripts/test` and `scripts/run` do so).

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let object = out.join("sampler.bpf.o");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    println!("cargo:rerun-if-changed=src/sampler.bpf.c");
    println!("cargo:rerun-if-changed=src/sampler.h");
    println!("cargo:rerun-if-changed=src/python.h");
    println!("cargo:rerun-if-changed=src/python.bpf.h");
    println!("cargo:rerun-if-env-changed=CLANG");
    // -g keeps BTF, which aya needs for BTF-defined maps; -Werror keeps the contract warning-free.
    let status = Command::new(&clang)
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
            "src/sampler.bpf.c",
            "-o",
        ])
        .arg(&object)
        .status()
        .unwrap_or_else(|err| {
            panic!(
                "running {clang} to compile the eBPF sampler failed: {err}; \
                 install it with `apt-get install clang libbpf-dev` or set CLANG"
            )
        });
    assert!(
        status.success(),
        "{clang} failed to compile src/sampler.bpf.c ({status})"
    );
}

//! Integration and property tests of `smolder-unwind`, one module per concern.

/// The cache format: round trips, and damaged or hostile bytes only ever error.
mod cache;
/// ELF inputs: sectionless files, `.debug_frame` (also in a separate debug file), the vDSO, Go.
mod elf;
/// Tables of Debian's libc, ld.so, python3.11 and libstdc++ agree with `readelf`.
mod readelf;
/// A `gcc -O2` program's real stacks, unwound by the evaluator, give the known call paths.
mod stack;
/// Helpers shared by the modules above.
mod util;

//! The vDSO, copied out of the agent's own memory: every 64-bit process of one kernel maps the
//! same image, so one table serves them all, at each process's own address.
//!
//! Output: the image's bytes. Caller: the unwinder's worker, once. Owns nothing.

use crate::ebpf::process::{Object, ProcessMap};

/// The bytes of this process's vDSO; `None` when the kernel maps none.
pub(crate) fn own_vdso() -> Option<Vec<u8>> {
    // SAFETY: getauxval only reads the auxiliary vector.
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    if base == 0 {
        return None;
    }
    let map = ProcessMap::read(std::process::id()).ok()?;
    let mapping = map
        .mappings
        .iter()
        .find(|m| m.object == Object::Vdso && m.start == base)?;
    let len = usize::try_from(mapping.end - mapping.start).ok()?;
    // SAFETY: the kernel maps the vDSO image readable at [base, base + len) for the whole life
    // of the process (the `[vdso]` line of our own maps says so), and nothing writes to it.
    let image = unsafe { std::slice::from_raw_parts(base as *const u8, len) };
    Some(image.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vdso_is_an_elf_image_with_call_frame_information() {
        let image = own_vdso().expect("x86-64 Linux maps a vDSO");
        let elf = smolder_unwind::Elf::parse(&image).unwrap();
        assert!(elf.build_id().is_some());
        let table = smolder_unwind::build(&elf, None, &smolder_unwind::Limits::default()).unwrap();
        assert!(table.stats().fdes > 0);
    }
}

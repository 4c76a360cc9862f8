//! The reader of the samples ring buffer's records (`parse_sample`) on arbitrary bytes: the
//! kernel writes them, but a reader must survive a torn or foreign record. Never panics; an
//! accepted record holds exactly the frames its header counts, within the bounds, and its
//! frame bytes are the user frames then the kernel frames.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_agent_ebpf::unwind::{KERNEL_FRAMES, MAX_FRAMES, parse_sample};

fuzz_target!(|data: &[u8]| {
    let Ok(sample) = parse_sample(data) else {
        return;
    };
    let user: Vec<u64> = sample.user().collect();
    let kernel: Vec<u64> = sample.kernel().collect();
    assert_eq!(user.len(), usize::from(sample.header.len));
    assert_eq!(kernel.len(), usize::from(sample.header.kernel_len));
    assert!(user.len() <= MAX_FRAMES && kernel.len() <= KERNEL_FRAMES);
    let bytes: Vec<u8> = user
        .iter()
        .chain(&kernel)
        .flat_map(|frame| frame.to_le_bytes())
        .collect();
    assert_eq!(sample.frame_bytes(), bytes.as_slice());
    assert!(data.len() >= bytes.len());
});

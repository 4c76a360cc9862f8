/* The contract between the kernel-side sampler (sampler.bpf.c) and the agent (agent/src/ebpf/).
 *
 * Every struct, map name and constant both sides share is declared here. The Rust mirror lives in
 * agent-ebpf/src/lib.rs with #[repr(C)], an aya::Pod impl and a size assertion per struct; keep
 * the two in step. Map and program names are the same on both sides.
 */
#ifndef SMOLDER_SAMPLER_H
#define SMOLDER_SAMPLER_H

/* The kernel's PERF_MAX_STACK_DEPTH: bpf_get_stackid records at most this many frames. */
#define SMOLDER_MAX_STACK_DEPTH 127

/* Default map sizes; the agent overrides them at load time from its config (ebpf: section). */
#define SMOLDER_COUNTS_ENTRIES 16384
#define SMOLDER_STACKS_ENTRIES 16384
#define SMOLDER_SEEN_ENTRIES 65536
#define SMOLDER_EVENTS_BYTES (256 * 1024)

/* Indexes into the per-CPU `errors` array. */
enum smolder_error {
	/* The counts map of the active buffer was full: the sample is lost. */
	SMOLDER_ERR_COUNTS_FULL = 0,
	/* bpf_get_stackid -EEXIST: the user stack's bucket held another stack. The sample is kept
	 * with a negative user stack id. */
	SMOLDER_ERR_USER_STACK_COLLISION = 1,
	/* The same for the kernel stack. */
	SMOLDER_ERR_KERNEL_STACK_COLLISION = 2,
	/* bpf_get_stackid failed otherwise for the user stack (-ENOMEM...), -EFAULT excluded. */
	SMOLDER_ERR_USER_STACK_OTHER = 3,
	/* The same for the kernel stack. */
	SMOLDER_ERR_KERNEL_STACK_OTHER = 4,
	/* The events ring buffer was full: a process event is lost. */
	SMOLDER_ERR_EVENTS_LOST = 5,
	SMOLDER_ERR_COUNT = 6,
};

/* Kinds of process event sent through the `events` ring buffer. */
enum smolder_event_kind {
	/* The first sample of a process (or the first after it was forgotten). */
	SMOLDER_EVENT_FIRST_SIGHT = 1,
	/* The process called execve: its memory map and name changed. */
	SMOLDER_EVENT_EXEC = 2,
	/* The process's main thread exited. */
	SMOLDER_EVENT_EXIT = 3,
};

/* Key of the counts maps: one process and its stacks. Stack ids are indexes into the stacks map
 * of the same buffer, or a negative errno when bpf_get_stackid failed (-EFAULT for the kernel
 * stack of a sample taken in user mode, and for the user stack when a Python stack replaces it).
 * For CPython processes (python.h), python_status says what the walk found; with
 * SMOLDER_PYTHON_OK or _TRUNCATED, (tgid, python_len, python_hash) is the python_stack_key of
 * the sample's Python stack. 24 bytes, no padding. */
struct sample_key {
	__u32 tgid;
	__s32 user_stack_id;
	__s32 kernel_stack_id;
	__u16 python_status;
	__u16 python_len;
	__u64 python_hash;
};

_Static_assert(sizeof(struct sample_key) == 24, "sample_key is 24 bytes");

/* One entry of the `events` ring buffer. 8 bytes, no padding. */
struct process_event {
	__u32 tgid;
	__u32 kind;
};

#endif

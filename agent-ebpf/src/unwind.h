/* The contract between the BPF unwinder (unwind.bpf.h, used by unwinder.bpf.c) and user space
 * (agent-ebpf/src/lib.rs mirrors it; smolder-unwind builds the tables).
 *
 * Tables: one inner ARRAY of u64 entries per executable, in `unwind_tables` (HASH_OF_MAPS keyed
 * by a 64-bit executable id the agent assigns). Entry layout, as smolder_unwind::UnwindTable
 * writes it:
 *   [0]                 u32 first_page | u32 n_pages        (page = ELF address >> 12)
 *   [1 .. n_pages]      u32 lo | u32 hi                     (row indexes, hi exclusive)
 *   [1 + n_pages ..]    struct unwind_row, sorted by address
 * Mappings: `unwind_mappings` (LPM trie) maps (tgid, runtime address) to the executable mapped
 * there, its load bias and the table's shape.
 *
 * Keep every number here equal to smolder_unwind's (rule.rs, eval.rs): agent-ebpf's tests
 * compare them.
 */
#ifndef SMOLDER_UNWIND_H
#define SMOLDER_UNWIND_H

#include "python.h"

/* Frames a sample can hold; the walk's depth (the `unwind_max_frames` global, default 128) is
 * at most this. */
#define SMOLDER_UNWIND_MAX_FRAMES 256
#define SMOLDER_UNWIND_DEFAULT_FRAMES 128

/* Binary-search steps inside one 4 KiB page: a page holds at most 4,095 rows. Small pages keep
 * the search short: each step is a helper call, and a helper call is what a frame costs most
 * on hosts whose kernel mitigates return-stack attacks (SRSO's safe RET on AMD). */
#define SMOLDER_UNWIND_PAGE_BITS 12
#define SMOLDER_UNWIND_SEARCH_STEPS 12

/* Mappings a walk remembers, so that frames in a binary already met skip the trie lookup. */
#define SMOLDER_UNWIND_MAPPING_CACHE 2

/* Rows a caller remembers across its walks, by (executable id, table size, ELF address),
 * direct-mapped: a hot frame, sampled again and again, skips the table and its search. An
 * executable id names one executable for the agent's life and its table is built from that
 * executable alone, so entries do not go stale; the size is checked too, for a table rebuilt
 * from other input (a debug file that appeared since). */
#define SMOLDER_UNWIND_ROW_CACHE 512

/* Bytes of user stack a walk copies at once: the frames above are read from the copy, not one
 * user read (the dearest helper of a frame) per saved register. */
#define SMOLDER_UNWIND_WINDOW_BYTES 512

/* Map sizes (the agent may override them at load time). */
#define SMOLDER_UNWIND_TABLES_ENTRIES 4096
#define SMOLDER_UNWIND_MAPPINGS_ENTRIES (256 * 1024)
#define SMOLDER_UNWIND_SAMPLES_BYTES (2 * 1024 * 1024)

/* Kernel frames a sample can hold after its user frames (the kernel's PERF_MAX_STACK_DEPTH). */
#define SMOLDER_UNWIND_KERNEL_FRAMES 127

/* Words a sample can hold after its kernel frames: the Python frames of a CPython sample
 * (python.h), two words each. */
#define SMOLDER_UNWIND_PYTHON_WORDS (2 * SMOLDER_PYTHON_MAX_FRAMES)

/* A frame-pointer step accepts rbp at most this far above rsp (a main thread's default stack). */
#define SMOLDER_UNWIND_MAX_FP_FRAME (8 << 20)

/* Signal frames: at __restore_rt, rsp points at the ucontext; its gregs start 40 bytes in. */
#define SMOLDER_UNWIND_SIGNAL_GREGS 40
#define SMOLDER_UNWIND_SIGNAL_RBP 10
#define SMOLDER_UNWIND_SIGNAL_RSP 15
#define SMOLDER_UNWIND_SIGNAL_RIP 16

/* CFA kinds of a row (smolder_unwind::CFA_*). */
enum smolder_unwind_cfa {
	SMOLDER_CFA_NO_FDE = 0,      /* no FDE: frame-pointer step */
	SMOLDER_CFA_RSP = 1,         /* rsp + cfa_off */
	SMOLDER_CFA_RSP_X8 = 2,      /* rsp + 8 * cfa_off */
	SMOLDER_CFA_RBP = 3,         /* rbp + cfa_off */
	SMOLDER_CFA_PLT1 = 4,        /* rsp + 8 + ((rip & 15) >= 11 ? 8 : 0) */
	SMOLDER_CFA_PLT2 = 5,        /* rsp + 8 + ((rip & 15) >= 10 ? 8 : 0) */
	SMOLDER_CFA_DEREF_RSP = 6,   /* *(rsp + cfa_off) + fp_off, rbp unchanged */
	SMOLDER_CFA_SIGNAL = 7,      /* registers from the ucontext at rsp; next frame is a leaf */
	SMOLDER_CFA_END = 8,         /* return address undefined: the stack ends */
	SMOLDER_CFA_UNSUPPORTED = 9, /* cfa_off holds the reason */
};

/* How the caller's rbp is recovered (smolder_unwind::FP_*). */
enum smolder_unwind_fp {
	SMOLDER_FP_SAME = 0,   /* unchanged */
	SMOLDER_FP_AT_CFA = 1, /* saved at CFA + fp_off */
	SMOLDER_FP_LOST = 2,   /* unknown from here on */
};

/* Why a walk ended (smolder_unwind::eval::Status::code). */
enum smolder_unwind_status {
	SMOLDER_UNWIND_COMPLETE = 0,          /* an end-of-stack row, or a zero return address a row found */
	SMOLDER_UNWIND_TRUNCATED = 1,         /* the frame limit was reached */
	SMOLDER_UNWIND_NO_TABLE = 2,          /* a frame-pointer step without table failed its checks */
	SMOLDER_UNWIND_BAD_FRAME_POINTER = 3, /* a frame-pointer step at an address without FDE failed */
	SMOLDER_UNWIND_UNSUPPORTED = 4,       /* a row the unwinder does not compute (detail: reason) */
	SMOLDER_UNWIND_FP_LOST = 5,           /* a frame needed rbp, which an earlier frame lost */
	SMOLDER_UNWIND_READ_FAULT = 6,        /* the stack could not be read */
	SMOLDER_UNWIND_NOT_MOVING_UP = 7,     /* the computed CFA was not above rsp */
	SMOLDER_UNWIND_NO_USER_STACK = 8,     /* a kernel thread, or no user registers */
	SMOLDER_UNWIND_FP_END = 9,            /* a frame-pointer step met rbp 0 or a zero return address */
	SMOLDER_UNWIND_STATUS_COUNT = 10,
};

/* What a sample measures. */
enum smolder_sample_kind {
	SMOLDER_SAMPLE_CPU = 1,          /* a cpu-clock tick (perf_event) */
	SMOLDER_SAMPLE_UPROBE = 2,       /* a uprobe hit (the point check of the tests) */
	SMOLDER_SAMPLE_OFF_CPU = 3,      /* a thread blocked (switch-out): value = ktime, threshold */
	SMOLDER_SAMPLE_RUN_QUEUE = 4,    /* a thread preempted while runnable: as OFF_CPU */
	SMOLDER_SAMPLE_OFF_CPU_END = 5,  /* that thread ran again: value = ktime, no frames */
	SMOLDER_SAMPLE_MEMORY = 6,       /* a page fault: value = faults it stands for, addr */
};

/* Per-CPU counters in `unwind_counters`. */
enum smolder_unwind_counter {
	SMOLDER_UNWIND_SAMPLES_LOST = 0, /* the samples ring buffer was full */
	SMOLDER_UNWIND_EVENTS_LOST = 1,  /* the process events ring buffer was full */
	SMOLDER_UNWIND_ROWS_CACHED = 2,  /* frames whose row came from the row cache */
	SMOLDER_UNWIND_ROWS_SEARCHED = 3, /* frames whose row was searched for in a table */
	SMOLDER_UNWIND_COUNTER_COUNT = 4,
};

/* One row: 8 bytes, no padding, little-endian (smolder_unwind::Rule::encode). */
struct unwind_row {
	__u16 pc_low;
	__u8 cfa_kind;
	__u8 fp_kind;
	__u16 cfa_off;
	__s16 fp_off;
};

/* Key of `unwind_mappings`: an LPM trie key whose data is (tgid, address), both big-endian so
 * that prefixes run from the pid's high bits to the address's low bits. 16 bytes, no padding;
 * user space sees {u32 prefixlen} followed by a packed 12-byte {u32 pid_be, u64 addr_be}. */
struct unwind_mapping_key {
	__u32 prefixlen;
	__u32 pid_be;
	__u64 addr_be;
};

/* Value of `unwind_mappings`. exe_id 0 means no table (anonymous or JIT code, a table not built
 * yet or refused): frame-pointer steps there. Every prefix of one mapping holds the same value,
 * whose [start, end) lets a walk reuse it for the next frame in that range. 48 bytes, no
 * padding. */
struct unwind_mapping {
	__u64 exe_id;
	__u64 bias;       /* runtime address - ELF address */
	__u32 first_page; /* the table's header, repeated to save a lookup */
	__u32 n_pages;
	__u32 n_entries;  /* entries in the table: 1 + n_pages + rows */
	__u32 flags;      /* reserved, zero */
	__u64 start;      /* the mapping's runtime range, end exclusive */
	__u64 end;
};

/* The registers a walk starts from. 24 bytes. */
struct unwind_regs {
	__u64 ip;
	__u64 sp;
	__u64 bp;
};

/* What the samples ring buffer carries: this header, then `len` user frames (u64 instruction
 * pointers, leaf first; return addresses as read, not minus one), then `kernel_len` kernel
 * frames (leaf first, from bpf_get_stack), then `python_len` struct python_frame (innermost
 * first) for a thread of a CPython process (python.h). 56 bytes, no padding. */
struct unwind_sample {
	__u32 kind;            /* enum smolder_sample_kind */
	__u32 tgid;
	__u32 tid;
	__u32 cpu;
	__u16 kernel_len;      /* kernel frames after the user frames; 0 for a sample in user mode */
	__u16 kernel_error;    /* -errno of bpf_get_stack when it failed, else 0 */
	__u16 status;          /* enum smolder_unwind_status */
	__u16 len;             /* user frames that follow */
	__u16 fp_frames;       /* frames found by frame-pointer steps */
	__u16 detail;          /* the unsupported reason, with SMOLDER_UNWIND_UNSUPPORTED */
	__u16 python_status;   /* enum smolder_python_status; 0 outside CPython processes */
	__u16 python_len;      /* Python frames after the kernel frames */
	__u64 value;           /* 1 for CPU samples and uprobe hits; see enum smolder_sample_kind */
	__u64 addr;            /* memory: the faulting address; 0 otherwise */
	__u32 threshold;       /* off-CPU: the sampling threshold it was taken with (offcpu.h) */
	__u32 flags;           /* memory: SMOLDER_SAMPLE_HUGE(_UNKNOWN) */
};

/* Flags of struct unwind_sample. */
#define SMOLDER_SAMPLE_HUGE 1
/* A flag of memory samples: the page tables could not be read, a huge page counts as base. */
#define SMOLDER_SAMPLE_HUGE_UNKNOWN 2

/* An entry of a scratch's row cache. 32 bytes. */
struct unwind_row_entry {
	__u64 exe_id;
	__u64 rel;         /* the ELF address looked up */
	__u32 n_entries;   /* the table's size when the row was found */
	__u32 pad;
	struct unwind_row row;
};

/* A caller's scratch: the sample being built and the walk's registers. Every program type that
 * can interrupt another (perf_event's NMI inside tp_btf or a uprobe) has its own per-CPU
 * scratch map, so no two walks on one CPU ever share one. */
struct unwind_scratch {
	struct unwind_sample sample;
	/* User frames, then room for the kernel frames after the last of them, then for the
	 * Python frames after the last kernel frame. */
	__u64 frames[SMOLDER_UNWIND_MAX_FRAMES + SMOLDER_UNWIND_KERNEL_FRAMES +
		     SMOLDER_UNWIND_PYTHON_WORDS];
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u32 tgid;
	__u8 leaf;     /* ip is exact (first frame, after a signal frame), not a return address */
	__u8 bp_valid; /* bp is the caller's real rbp */
	__u8 cache_next; /* the mapping cache's slot to replace next */
	__u8 pad;
	/* This walk's frames by where their row came from, added to unwind_counters at its end:
	 * one counter update per walk, not per frame. */
	__u16 rows_cached;
	__u16 rows_searched;
	/* The mappings this walk met (start == end: empty). */
	struct unwind_mapping cache[SMOLDER_UNWIND_MAPPING_CACHE];
	/* Rows found by earlier walks of this caller on this CPU (exe_id 0: empty). Kept across
	 * walks: never reset. */
	struct unwind_row_entry rows[SMOLDER_UNWIND_ROW_CACHE];
	/* A copy of the user stack at [window_base, window_base + window_len). */
	__u64 window[SMOLDER_UNWIND_WINDOW_BYTES / 8];
	__u64 window_base;
	__u64 window_len;
	/* The Python walk's copy of the frame it reads (python.bpf.h). */
	__u8 python_frame[SMOLDER_PYTHON_FRAME_BUF];
};

/* The kernel caps a per-CPU map's value at 32 KiB (PCPU_MIN_UNIT_SIZE): the scratch, row cache
 * included, must fit. */
_Static_assert(sizeof(struct unwind_scratch) <= 32768, "a per-CPU scratch fits 32 KiB");

/* The sizes the Rust mirror asserts too. */
_Static_assert(sizeof(struct unwind_row) == 8, "unwind_row is 8 bytes");
_Static_assert(sizeof(struct unwind_mapping_key) == 16, "unwind_mapping_key is 16 bytes");
_Static_assert(sizeof(struct unwind_mapping) == 48, "unwind_mapping is 48 bytes");
_Static_assert((SMOLDER_UNWIND_WINDOW_BYTES & (SMOLDER_UNWIND_WINDOW_BYTES - 1)) == 0 &&
		       SMOLDER_UNWIND_WINDOW_BYTES <= 4096,
	       "the window masks as a power of two and fits a page");
_Static_assert((SMOLDER_UNWIND_MAPPING_CACHE & (SMOLDER_UNWIND_MAPPING_CACHE - 1)) == 0 &&
		       (SMOLDER_UNWIND_ROW_CACHE & (SMOLDER_UNWIND_ROW_CACHE - 1)) == 0,
	       "the caches' slots mask as powers of two");
_Static_assert(sizeof(struct unwind_sample) == 56, "unwind_sample is 56 bytes");
_Static_assert(__builtin_offsetof(struct unwind_sample, python_status) == 28, "as unwind.rs");
_Static_assert(__builtin_offsetof(struct unwind_sample, value) == 32, "as unwind.rs");
_Static_assert(__builtin_offsetof(struct unwind_sample, addr) == 40, "as unwind.rs");
_Static_assert(__builtin_offsetof(struct unwind_sample, threshold) == 48, "as unwind.rs");
_Static_assert(__builtin_offsetof(struct unwind_sample, flags) == 52, "as unwind.rs");
_Static_assert(__builtin_offsetof(struct unwind_scratch, frames) == sizeof(struct unwind_sample),
	       "the frames follow the sample header, so that both go out in one ring-buffer write");

#endif

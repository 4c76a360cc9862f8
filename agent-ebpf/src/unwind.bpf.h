/* The BPF unwinder: walks a user stack with the unwind tables user space built from .eh_frame
 * (smolder-unwind), falling back to one checked frame-pointer step where no table applies.
 *
 * Calling contract, for every entry point (the perf_event CPU and page-fault samplers,
 * tp_btf/sched_switch, uprobes):
 *   1. take the caller's OWN per-CPU scratch (struct unwind_scratch): a program that can interrupt
 *      another (perf_event runs in NMI, inside tp_btf or uprobe programs) must never share one;
 *   2. fill scratch->sample's kind, tgid, tid, cpu, value, threshold, addr and flags, and zero
 *      python_status and python_len;
 *   3. unwind_user(scratch, &regs, tgid) with the user registers the caller found (or
 *      unwind_none(scratch) when there are none);
 *   4. unwind_kernel(ctx, scratch, skip) appends the kernel stack, or unwind_no_kernel(scratch);
 *      then, for a CPython process, python_walk (python.bpf.h) appends its Python frames;
 *   5. unwind_output(scratch) sends the header and the frames used through `unwind_samples`.
 * The walk never invents a frame: every step either follows a table row or passes the
 * frame-pointer checks (8-aligned, above rsp, within 8 MiB, moving up), and the sample says why
 * it stopped (enum smolder_unwind_status).
 *
 * One frame per bpf_loop iteration: the callback is verified once, whatever the depth.
 */
#ifndef SMOLDER_UNWIND_BPF_H
#define SMOLDER_UNWIND_BPF_H

#include <bpf/bpf_endian.h>

#include "unwind.h"

/* Frames per walk (at most SMOLDER_UNWIND_MAX_FRAMES); the agent patches it at load time. */
const volatile __u32 unwind_max_frames = SMOLDER_UNWIND_DEFAULT_FRAMES;

/* Executable id -> that executable's table. The inner template is described by key and value
 * sizes, not types: clang 14 emits a BTF forward declaration for a struct value inside
 * __array, which aya refuses. BPF_F_INNER_MAP lets every table have its exact size;
 * BPF_F_MMAPABLE lets the agent fill it through a mapping instead of a syscall per entry. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, SMOLDER_UNWIND_TABLES_ENTRIES);
	__type(key, __u64);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_ARRAY);
		__uint(map_flags, BPF_F_INNER_MAP | BPF_F_MMAPABLE);
		__uint(max_entries, 1);
		__uint(key_size, sizeof(__u32));
		__uint(value_size, sizeof(__u64));
	});
} unwind_tables SEC(".maps");

/* (tgid, address) -> the executable mapped there. Entries are allocated on use. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, SMOLDER_UNWIND_MAPPINGS_ENTRIES);
	__type(key, struct unwind_mapping_key);
	__type(value, struct unwind_mapping);
} unwind_mappings SEC(".maps");

/* Samples: struct unwind_sample, then its frames. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, SMOLDER_UNWIND_SAMPLES_BYTES);
} unwind_samples SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SMOLDER_UNWIND_COUNTER_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} unwind_counters SEC(".maps");

static __always_inline void unwind_count_by(__u32 index, __u64 n)
{
	__u64 *value = bpf_map_lookup_elem(&unwind_counters, &index);
	if (value)
		*value += n; /* per-CPU slot: no other writer */
}

static __always_inline void unwind_count(__u32 index)
{
	unwind_count_by(index, 1);
}

/* Reads the user word at `addr` into `out`, from the walk's copy of the stack when it holds it,
 * else by copying the window that starts there: as far as SMOLDER_UNWIND_WINDOW_BYTES, or, when
 * that crosses into an unreadable page (the top of a stack), to the end of addr's page. Returns
 * 0 on success, like bpf_probe_read_user. */
static __always_inline long unwind_read_user(struct unwind_scratch *st, __u64 addr, __u64 *out)
{
	__u64 off = addr - st->window_base;
	if (!(addr & 7) && addr >= st->window_base && off < st->window_len) {
		*out = st->window[(off / 8) & (SMOLDER_UNWIND_WINDOW_BYTES / 8 - 1)];
		return 0;
	}
	st->window_len = 0;
	if (addr & 7)
		return bpf_probe_read_user(out, sizeof(*out), (void *)addr);
	__u64 len = SMOLDER_UNWIND_WINDOW_BYTES;
	if (bpf_probe_read_user(st->window, len, (void *)addr)) {
		len = 4096 - (addr & 4095);
		if (len > SMOLDER_UNWIND_WINDOW_BYTES)
			len = SMOLDER_UNWIND_WINDOW_BYTES;
		if (len < 8 || bpf_probe_read_user(st->window, len, (void *)addr))
			return bpf_probe_read_user(out, sizeof(*out), (void *)addr);
	}
	st->window_base = addr;
	st->window_len = len;
	*out = st->window[0];
	return 0;
}

/* Ends the walk with `status`; returns 1, bpf_loop's "stop". */
static __always_inline long unwind_stop(struct unwind_scratch *st, __u16 status)
{
	st->sample.status = status;
	return 1;
}

/* One frame-pointer step; `failure` is the status when its checks fail.
 *
 * rbp 0 (or a zero return address above it) ends the chain, but says the stack ends only where
 * every frame walked keeps a frame pointer: `_start` and glibc's `clone3` zero rbp, and code
 * built without frame pointers (Debian's, gcc -O2's) never sets it again, so a leaf of such code
 * sampled before its process's tables are in has rbp 0 too. Which of the two cannot be told
 * here: the walk ends FP_END, not COMPLETE. COMPLETE is only said by a table, whose
 * end-of-stack rows mark the true roots (`_start`, `clone3`'s child, Go's `runtime.goexit`). */
static __always_inline long unwind_fp_step(struct unwind_scratch *st, __u16 failure)
{
	if (!st->bp_valid)
		return unwind_stop(st, SMOLDER_UNWIND_FP_LOST);
	__u64 bp = st->bp;
	if (bp == 0)
		return unwind_stop(st, SMOLDER_UNWIND_FP_END);
	if ((bp & 7) || bp < st->sp || bp - st->sp >= SMOLDER_UNWIND_MAX_FP_FRAME)
		return unwind_stop(st, failure);
	__u64 saved[2]; /* the caller's rbp, then the return address */
	if (unwind_read_user(st, bp, &saved[0]) || unwind_read_user(st, bp + 8, &saved[1]))
		return unwind_stop(st, SMOLDER_UNWIND_READ_FAULT);
	if (saved[1] == 0)
		return unwind_stop(st, SMOLDER_UNWIND_FP_END);
	st->ip = saved[1];
	st->sp = bp + 16;
	st->bp = saved[0];
	st->leaf = 0;
	st->sample.fp_frames += 1;
	return 0;
}

/* A signal trampoline: the interrupted registers are in the ucontext at rsp. */
static __always_inline long unwind_signal_step(struct unwind_scratch *st)
{
	__u64 gregs[SMOLDER_UNWIND_SIGNAL_RIP + 1];
	if (bpf_probe_read_user(gregs, sizeof(gregs), (void *)(st->sp + SMOLDER_UNWIND_SIGNAL_GREGS)))
		return unwind_stop(st, SMOLDER_UNWIND_READ_FAULT);
	if (gregs[SMOLDER_UNWIND_SIGNAL_RIP] == 0)
		return unwind_stop(st, SMOLDER_UNWIND_COMPLETE);
	st->ip = gregs[SMOLDER_UNWIND_SIGNAL_RIP];
	st->sp = gregs[SMOLDER_UNWIND_SIGNAL_RSP];
	st->bp = gregs[SMOLDER_UNWIND_SIGNAL_RBP];
	st->bp_valid = 1;
	st->leaf = 1;
	return 0;
}

/* The row governing `rel` (an ELF address) in `table`, copied to `row`; 0 when no row does.
 * The search keeps the last row it found at or before the address, so that only an address
 * before the first row of its page needs one more lookup (of the row before the page). */
static __always_inline int unwind_find_row(void *table, const struct unwind_mapping *m, __u64 rel,
					   struct unwind_row *row)
{
	__u64 page = rel >> SMOLDER_UNWIND_PAGE_BITS;
	if (page < m->first_page || page - m->first_page >= m->n_pages)
		return 0;
	__u32 index = 1 + (__u32)(page - m->first_page);
	__u64 *dir = bpf_map_lookup_elem(table, &index);
	if (!dir)
		return 0;
	__u32 lo = (__u32)*dir, hi = (__u32)(*dir >> 32);
	__u32 base = 1 + m->n_pages;
	__u16 low = (__u16)(rel & ((1 << SMOLDER_UNWIND_PAGE_BITS) - 1));
	int found = 0;
	/* The first row above the address; the row before it governs (possibly the previous
	 * page's last row). */
	for (int i = 0; i < SMOLDER_UNWIND_SEARCH_STEPS; i++) {
		if (lo >= hi)
			break;
		__u32 mid = lo + (hi - lo) / 2;
		index = base + mid;
		struct unwind_row *r = bpf_map_lookup_elem(table, &index);
		if (!r)
			return 0;
		if (r->pc_low <= low) {
			*row = *r;
			found = 1;
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	if (found)
		return 1;
	if (lo == 0)
		return 0;
	index = base + lo - 1;
	struct unwind_row *before = bpf_map_lookup_elem(table, &index);
	if (!before)
		return 0;
	*row = *before;
	return 1;
}

/* The mapping at `pc` in the walk's process, copied to `out`: from the walk's cache when a
 * mapping met before covers it, else from the trie (and then cached). 0 when none is known. */
static __always_inline int unwind_mapping_at(struct unwind_scratch *st, __u64 pc,
					     struct unwind_mapping *out)
{
	for (int i = 0; i < SMOLDER_UNWIND_MAPPING_CACHE; i++) {
		struct unwind_mapping *c = &st->cache[i];
		if (pc >= c->start && pc < c->end) {
			*out = *c;
			return 1;
		}
	}
	struct unwind_mapping_key key = {
		.prefixlen = 96,
		.pid_be = bpf_htonl(st->tgid),
		.addr_be = bpf_cpu_to_be64(pc),
	};
	struct unwind_mapping *m = bpf_map_lookup_elem(&unwind_mappings, &key);
	if (!m)
		return 0;
	*out = *m;
	__u32 slot = st->cache_next & (SMOLDER_UNWIND_MAPPING_CACHE - 1);
	st->cache[slot] = *m;
	st->cache_next = slot + 1;
	return 1;
}

/* The row cache's slot for (exe_id, rel): a multiplicative hash of both. */
static __always_inline struct unwind_row_entry *unwind_row_slot(struct unwind_scratch *st,
								__u64 exe_id, __u64 rel)
{
	__u64 hash = (rel ^ (exe_id << 40)) * 0x9E3779B97F4A7C15ULL;
	return &st->rows[(hash >> 32) & (SMOLDER_UNWIND_ROW_CACHE - 1)];
}

struct unwind_loop_ctx {
	struct unwind_scratch *st;
};

/* One frame: record the instruction pointer, then find the caller's registers. */
static long unwind_step(__u64 index, void *data)
{
	struct unwind_scratch *st = ((struct unwind_loop_ctx *)data)->st;
	__u32 len = st->sample.len;
	if (len >= unwind_max_frames || len >= SMOLDER_UNWIND_MAX_FRAMES)
		return unwind_stop(st, SMOLDER_UNWIND_TRUNCATED);
	st->frames[len & (SMOLDER_UNWIND_MAX_FRAMES - 1)] = st->ip;
	st->sample.len = len + 1;

	/* A return address looks up its call instruction. */
	__u64 pc = st->leaf ? st->ip : st->ip - 1;
	struct unwind_mapping m;
	if (!unwind_mapping_at(st, pc, &m) || m.exe_id == 0)
		return unwind_fp_step(st, SMOLDER_UNWIND_NO_TABLE);
	__u64 rel = pc - m.bias;
	struct unwind_row_entry *cached = unwind_row_slot(st, m.exe_id, rel);
	struct unwind_row row;
	if (cached->exe_id == m.exe_id && cached->rel == rel && cached->n_entries == m.n_entries) {
		/* Even if the table was evicted since: its rows stay true of the executable. */
		row = cached->row;
		st->rows_cached++;
	} else {
		void *table = bpf_map_lookup_elem(&unwind_tables, &m.exe_id);
		if (!table)
			return unwind_fp_step(st, SMOLDER_UNWIND_NO_TABLE);
		st->rows_searched++;
		if (!unwind_find_row(table, &m, rel, &row))
			return unwind_fp_step(st, SMOLDER_UNWIND_BAD_FRAME_POINTER);
		cached->exe_id = m.exe_id;
		cached->rel = rel;
		cached->n_entries = m.n_entries;
		cached->row = row;
	}

	__u64 cfa;
	switch (row.cfa_kind) {
	case SMOLDER_CFA_RSP:
		cfa = st->sp + row.cfa_off;
		break;
	case SMOLDER_CFA_RSP_X8:
		cfa = st->sp + (__u64)row.cfa_off * 8;
		break;
	case SMOLDER_CFA_RBP:
		if (!st->bp_valid)
			return unwind_stop(st, SMOLDER_UNWIND_FP_LOST);
		cfa = st->bp + row.cfa_off;
		break;
	case SMOLDER_CFA_PLT1:
		cfa = st->sp + 8 + ((st->ip & 15) >= 11 ? 8 : 0);
		break;
	case SMOLDER_CFA_PLT2:
		cfa = st->sp + 8 + ((st->ip & 15) >= 10 ? 8 : 0);
		break;
	case SMOLDER_CFA_DEREF_RSP: {
		__u64 value;
		if (unwind_read_user(st, st->sp + row.cfa_off, &value))
			return unwind_stop(st, SMOLDER_UNWIND_READ_FAULT);
		cfa = value + (__s64)row.fp_off;
		row.fp_kind = SMOLDER_FP_SAME;
		break;
	}
	case SMOLDER_CFA_SIGNAL:
		return unwind_signal_step(st);
	case SMOLDER_CFA_END:
		return unwind_stop(st, SMOLDER_UNWIND_COMPLETE);
	case SMOLDER_CFA_NO_FDE:
		return unwind_fp_step(st, SMOLDER_UNWIND_BAD_FRAME_POINTER);
	default:
		st->sample.detail = row.cfa_off;
		return unwind_stop(st, SMOLDER_UNWIND_UNSUPPORTED);
	}
	if (cfa <= st->sp)
		return unwind_stop(st, SMOLDER_UNWIND_NOT_MOVING_UP);
	__u64 ra;
	if (unwind_read_user(st, cfa - 8, &ra))
		return unwind_stop(st, SMOLDER_UNWIND_READ_FAULT);
	if (row.fp_kind == SMOLDER_FP_AT_CFA) {
		__u64 bp;
		if (unwind_read_user(st, cfa + (__s64)row.fp_off, &bp))
			return unwind_stop(st, SMOLDER_UNWIND_READ_FAULT);
		st->bp = bp;
		st->bp_valid = 1;
	} else if (row.fp_kind == SMOLDER_FP_LOST) {
		st->bp_valid = 0;
	}
	if (ra == 0)
		return unwind_stop(st, SMOLDER_UNWIND_COMPLETE);
	st->ip = ra;
	st->sp = cfa;
	st->leaf = 0;
	return 0;
}

/* Walks the user stack of `tgid` from `regs` into st->frames; st->sample.len and .status say
 * how far it got and why it stopped. */
static __always_inline void unwind_user(struct unwind_scratch *st, const struct unwind_regs *regs,
					__u32 tgid)
{
	st->sample.len = 0;
	st->sample.fp_frames = 0;
	st->sample.detail = 0;
	st->sample.status = SMOLDER_UNWIND_TRUNCATED;
	st->ip = regs->ip;
	st->sp = regs->sp;
	st->bp = regs->bp;
	st->tgid = tgid;
	st->leaf = 1;
	st->bp_valid = 1;
	for (int i = 0; i < SMOLDER_UNWIND_MAPPING_CACHE; i++) {
		st->cache[i].start = 0;
		st->cache[i].end = 0;
	}
	st->cache_next = 0;
	st->window_base = 0;
	st->window_len = 0;
	st->rows_cached = 0;
	st->rows_searched = 0;
	struct unwind_loop_ctx ctx = { .st = st };
	/* One more iteration than frames: the last one reports the truncation. */
	bpf_loop(SMOLDER_UNWIND_MAX_FRAMES + 1, unwind_step, &ctx, 0);
	if (st->rows_cached)
		unwind_count_by(SMOLDER_UNWIND_ROWS_CACHED, st->rows_cached);
	if (st->rows_searched)
		unwind_count_by(SMOLDER_UNWIND_ROWS_SEARCHED, st->rows_searched);
}

/* Marks the sample as having no user stack (kernel threads, no user registers). */
static __always_inline void unwind_none(struct unwind_scratch *st)
{
	st->sample.len = 0;
	st->sample.fp_frames = 0;
	st->sample.detail = 0;
	st->sample.status = SMOLDER_UNWIND_NO_USER_STACK;
}

/* Appends the kernel stack of `ctx` (a program context bpf_get_stack accepts) after the user
 * frames, leaving out its `skip` innermost frames (the BPF program's own, for a tracing
 * program). A sample taken in user mode has none. Kernel frames are sent as they are: kernel
 * stacks are not walked by this unwinder. */
static __always_inline void unwind_kernel(void *ctx, struct unwind_scratch *st, __u64 skip)
{
	__u32 len = st->sample.len;
	if (len > SMOLDER_UNWIND_MAX_FRAMES)
		len = SMOLDER_UNWIND_MAX_FRAMES;
	long bytes = bpf_get_stack(ctx, &st->frames[len],
				   SMOLDER_UNWIND_KERNEL_FRAMES * sizeof(__u64),
				   skip & BPF_F_SKIP_FIELD_MASK);
	if (bytes < 0) {
		st->sample.kernel_len = 0;
		st->sample.kernel_error = (__u16)-bytes;
	} else {
		st->sample.kernel_len = (__u16)(bytes / sizeof(__u64));
		st->sample.kernel_error = 0;
	}
}

/* Marks the sample as having no kernel stack (a uprobe fires in user context). */
static __always_inline void unwind_no_kernel(struct unwind_scratch *st)
{
	st->sample.kernel_len = 0;
	st->sample.kernel_error = 0;
}

/* Sends the sample header and the frames used (Python frames included, when a walk of them
 * filled sample.python_len); a full ring buffer is counted. Returns 0 when the sample went out. */
static __always_inline long unwind_output(struct unwind_scratch *st)
{
	__u64 len = st->sample.len;
	if (len > SMOLDER_UNWIND_MAX_FRAMES)
		len = SMOLDER_UNWIND_MAX_FRAMES;
	__u64 kernel_len = st->sample.kernel_len;
	if (kernel_len > SMOLDER_UNWIND_KERNEL_FRAMES)
		kernel_len = SMOLDER_UNWIND_KERNEL_FRAMES;
	__u64 python_words = 2 * (__u64)st->sample.python_len;
	if (python_words > SMOLDER_UNWIND_PYTHON_WORDS)
		python_words = SMOLDER_UNWIND_PYTHON_WORDS;
	long err = bpf_ringbuf_output(&unwind_samples, &st->sample,
				      sizeof(struct unwind_sample) +
					      (len + kernel_len + python_words) * sizeof(__u64),
				      BPF_RB_NO_WAKEUP);
	if (err)
		unwind_count(SMOLDER_UNWIND_SAMPLES_LOST);
	return err;
}

#endif

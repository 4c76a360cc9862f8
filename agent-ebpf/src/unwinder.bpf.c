// SPDX-License-Identifier: GPL-2.0
/* Smolder's sampler: the entry points of the BPF unwinder (unwind.bpf.h) and the process events.
 *
 * on_cpu (perf_event, one per online CPU) sends every tick's user stack, unwound from the
 * .eh_frame tables user space loaded, and its kernel stack, through `unwind_samples`; a process's
 * first sample also puts a FIRST_SIGHT event in `events`, so that user space reads the process
 * and loads its tables. on_exec and on_exit (raw tracepoints) send EXEC and EXIT.
 * on_switch (tp_btf/sched_switch) samples threads leaving the CPU and sends when they come back
 * (off-CPU, offcpu.h); on_fault (perf_event on page-faults-min) samples page faults and
 * tells those that mapped a transparent huge page, from the page tables (memory growth,
 * offcpu.h, pagetable.bpf.h); both unwind only the processes user space put in `profiled`.
 * on_uprobe (uprobe) unwinds at a probed instruction: the point check of the tests, where the
 * expected call path is known exactly. All four add the Python frames of a thread of a CPython
 * process the agent registered in `python_procs` (python.bpf.h, contract in python.h), walked
 * with the program's own scratch.
 *
 * Each entry point has its own per-CPU scratch: on_cpu runs in NMI context and can interrupt the
 * other programs on the same CPU.
 *
 * The kernel requires a GPL-compatible licence for bpf_get_stack, bpf_loop and the ring buffer
 * helpers.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>

#include "offcpu.h"
#include "process.h"
#include "unwind.bpf.h"
#include "python.bpf.h"
#include "pagetable.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* The agent's own process, patched in at load time; it is not sampled. */
const volatile __u32 self_tgid = 0;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct unwind_scratch);
} scratch_cpu SEC(".maps"), scratch_uprobe SEC(".maps"), scratch_switch SEC(".maps"),
	scratch_fault SEC(".maps");

/* Processes already announced. LRU, so it never fills: an evicted process is announced again
 * and the agent ignores what it already knows. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SMOLDER_SEEN_ENTRIES);
	__type(key, __u32);
	__type(value, __u8);
} seen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, SMOLDER_EVENTS_BYTES);
} events SEC(".maps");

static __always_inline void send_event(__u32 tgid, __u32 kind)
{
	struct process_event event = { .tgid = tgid, .kind = kind };
	if (bpf_ringbuf_output(&events, &event, sizeof(event), 0))
		unwind_count(SMOLDER_UNWIND_EVENTS_LOST);
}

/* Appends the Python frames of a CPython process's thread, if the agent registered the process. */
static __always_inline void python_frames(struct unwind_scratch *st, __u64 pid_tgid)
{
	__u32 tgid = pid_tgid >> 32;
	struct python_proc *proc = bpf_map_lookup_elem(&python_procs, &tgid);
	if (proc)
		python_walk(st, proc, (__u32)pid_tgid);
}

/* x86-64 user mode: the low two bits of cs are the privilege level 3. */
static __always_inline int user_mode(const struct pt_regs *regs)
{
	return (regs->cs & 3) == 3;
}

static __always_inline void regs_of(const struct pt_regs *regs, struct unwind_regs *out)
{
	out->ip = regs->rip;
	out->sp = regs->rsp;
	out->bp = regs->rbp;
}

/* The user registers `task` saved at its entry into the kernel; 0 when it has none (a kernel
 * thread). Only the four registers used are read, not the whole pt_regs: its 168 bytes on the
 * stack left on_switch's walk over the verifier's 512-byte limit for a call chain. */
static __always_inline int task_user_regs(struct task_struct *task, struct unwind_regs *out)
{
	struct pt_regs *saved = (struct pt_regs *)bpf_task_pt_regs(task);
	unsigned long cs;
	if (bpf_probe_read_kernel(&cs, sizeof(cs), &saved->cs) || (cs & 3) != 3)
		return 0;
	return bpf_probe_read_kernel(&out->ip, sizeof(out->ip), &saved->rip) == 0 &&
	       bpf_probe_read_kernel(&out->sp, sizeof(out->sp), &saved->rsp) == 0 &&
	       bpf_probe_read_kernel(&out->bp, sizeof(out->bp), &saved->rbp) == 0;
}

/* The user registers of the interrupted task: the sample's own when it interrupted user mode,
 * else those saved at the task's entry into the kernel. 0 when it has none (a kernel thread). */
static __always_inline int sample_user_regs(struct bpf_perf_event_data *ctx, struct unwind_regs *out)
{
	if (user_mode(&ctx->regs)) {
		regs_of(&ctx->regs, out);
		return 1;
	}
	return task_user_regs(bpf_get_current_task_btf(), out);
}

static __always_inline struct unwind_scratch *scratch(void *map, __u32 kind, __u64 pid_tgid)
{
	__u32 zero = 0;
	struct unwind_scratch *st = bpf_map_lookup_elem(map, &zero);
	if (!st)
		return 0;
	st->sample.kind = kind;
	st->sample.tgid = pid_tgid >> 32;
	st->sample.tid = (__u32)pid_tgid;
	st->sample.cpu = bpf_get_smp_processor_id();
	st->sample.value = 1;
	st->sample.threshold = 0;
	st->sample.addr = 0;
	st->sample.flags = 0;
	st->sample.python_status = SMOLDER_PYTHON_NONE;
	st->sample.python_len = 0;
	return st;
}

/* Announces a process at its first sample. */
static __always_inline void announce(__u32 tgid)
{
	if (!bpf_map_lookup_elem(&seen, &tgid)) {
		__u8 yes = 1;
		if (bpf_map_update_elem(&seen, &tgid, &yes, BPF_NOEXIST) == 0)
			send_event(tgid, SMOLDER_EVENT_FIRST_SIGHT);
	}
}

/* Processes the agent profiles (its relabelling keeps them), written by user space: off-CPU
 * and memory-growth samples are unwound for these only, so that the rest of the host's
 * switches and faults cost a lookup, not an unwind and a record the agent would drop. A
 * process not in it is announced, so that the agent decides. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SMOLDER_SEEN_ENTRIES);
	__type(key, __u32);
	__type(value, __u8);
} profiled SEC(".maps");

/* Whether `tgid` is profiled; announces it when it is not (yet). */
static __always_inline int is_profiled(__u32 tgid)
{
	if (bpf_map_lookup_elem(&profiled, &tgid))
		return 1;
	announce(tgid);
	return 0;
}

SEC("perf_event")
int on_cpu(struct bpf_perf_event_data *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	/* tgid 0 is the idle task. */
	if (tgid == 0 || tgid == self_tgid)
		return 0;
	announce(tgid);
	struct unwind_scratch *st = scratch(&scratch_cpu, SMOLDER_SAMPLE_CPU, pid_tgid);
	if (!st)
		return 0;
	struct unwind_regs regs;
	if (sample_user_regs(ctx, &regs))
		unwind_user(st, &regs, tgid);
	else
		unwind_none(st);
	unwind_kernel(ctx, st, 0);
	python_frames(st, pid_tgid);
	unwind_output(st);
	return 0;
}

/* Off-CPU: the sampling threshold and flags, written by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct offcpu_config);
} offcpu_config SEC(".maps");

/* Off-CPU: the switch-out of each thread sampled and not yet back; freed with the task. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct offcpu_pending);
} offcpu_pending SEC(".maps");

/* Off-CPU: each CPU's xorshift32 state, so that an unsampled switch calls no helper. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} offcpu_random SEC(".maps");

/* Off-CPU: how many threads whose id falls in each slot (id modulo the size) are sampled and not
 * back yet. A switch-in whose slot is 0 needs no task-storage lookup, which is a helper call:
 * most switch-ins are of threads that were not sampled. */
#define SMOLDER_OFF_CPU_SLOTS 16384
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SMOLDER_OFF_CPU_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} offcpu_slots SEC(".maps");

/* The `offcpu_slots` count of thread `tid`'s slot. */
static __always_inline __u32 *offcpu_slot(__u32 tid)
{
	__u32 key = tid % SMOLDER_OFF_CPU_SLOTS;
	return bpf_map_lookup_elem(&offcpu_slots, &key);
}

/* The switch-in half: a sampled thread runs again. */
static __always_inline void switch_in(struct task_struct *next)
{
	__u32 *slot = offcpu_slot(next->pid);
	if (!slot || !*slot)
		return;
	struct offcpu_pending *pending = bpf_task_storage_get(&offcpu_pending, next, 0, 0);
	if (!pending || !pending->start)
		return;
	__sync_fetch_and_add(slot, (__u32)-1);
	__u64 now = bpf_ktime_get_ns();
	struct unwind_sample end = {
		.kind = SMOLDER_SAMPLE_OFF_CPU_END,
		.tgid = pending->tgid,
		.tid = pending->tid,
		.cpu = bpf_get_smp_processor_id(),
		.status = SMOLDER_UNWIND_NO_USER_STACK,
		.value = now,
	};
	pending->start = 0;
	if (bpf_ringbuf_output(&unwind_samples, &end, sizeof(end), BPF_RB_NO_WAKEUP))
		unwind_count(SMOLDER_UNWIND_SAMPLES_LOST);
}

/* The switch-out half: `prev` is the current task. Everything here runs with the run-queue lock
 * held: the path of an unsampled switch is a few compares and one random number, and calls no
 * helper (ids from `prev`, the number from offcpu_random): on a host with return-stack
 * mitigations each helper call cost tens of nanoseconds (BENCHMARKS.md, off-CPU). The clock is
 * read only on the sampled paths. */
static __always_inline void switch_out(void *ctx, struct task_struct *prev, int preempt,
				       unsigned int prev_state)
{
	__u32 tgid = prev->tgid;
	if (tgid == 0 || tgid == self_tgid)
		return;
	__u64 pid_tgid = ((__u64)tgid << 32) | (__u32)prev->pid;
	__u32 zero = 0;
	struct offcpu_config *config = bpf_map_lookup_elem(&offcpu_config, &zero);
	if (!config || !config->threshold)
		return;
	__u32 kind = SMOLDER_SAMPLE_OFF_CPU;
	if (preempt || prev_state == SMOLDER_TASK_RUNNING) {
		if (!(config->flags & SMOLDER_OFF_CPU_RUN_QUEUE))
			return;
		kind = SMOLDER_SAMPLE_RUN_QUEUE;
	} else if (prev_state & SMOLDER_TASK_DEAD) {
		return; /* its last switch: it never comes back */
	}
	__u32 threshold = config->threshold;
	if (threshold != SMOLDER_OFF_CPU_ALWAYS) {
		__u32 *state = bpf_map_lookup_elem(&offcpu_random, &zero);
		if (!state)
			return;
		__u32 x = *state;
		if (!x)
			x = bpf_get_prandom_u32() | 1;
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		*state = x;
		if (x > threshold)
			return;
	}
	if (!is_profiled(tgid))
		return;
	/* Kernel threads have no user registers saved: they are not sampled. */
	struct unwind_regs user;
	if (!task_user_regs(prev, &user))
		return;
	struct offcpu_pending *pending = bpf_task_storage_get(&offcpu_pending, prev, 0,
							      BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!pending)
		return;
	struct unwind_scratch *st = scratch(&scratch_switch, kind, pid_tgid);
	if (!st)
		return;
	__u64 now = bpf_ktime_get_ns();
	st->sample.value = now;
	st->sample.threshold = threshold;
	unwind_user(st, &user, tgid);
	unwind_kernel(ctx, st, SMOLDER_SWITCH_SKIP_FRAMES);
	python_frames(st, pid_tgid);
	if (unwind_output(st) == 0) {
		__u32 *slot = offcpu_slot((__u32)pid_tgid);
		if (!slot)
			return;
		/* Its last sample's switch-in cleared the record; should one have been missed,
		 * the thread still counts once. */
		if (!pending->start)
			__sync_fetch_and_add(slot, 1);
		pending->tgid = tgid;
		pending->tid = (__u32)pid_tgid;
		pending->start = now;
	}
}

/* tp_btf/sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
 * unsigned int prev_state), on the CPU switching, in prev's context. */
SEC("tp_btf/sched_switch")
int on_switch(__u64 *ctx)
{
	int preempt = (int)ctx[0];
	struct task_struct *prev = (struct task_struct *)ctx[1];
	struct task_struct *next = (struct task_struct *)ctx[2];
	unsigned int prev_state = (unsigned int)ctx[3];
	switch_out(ctx, prev, preempt, prev_state);
	switch_in(next);
	return 0;
}

/* Memory growth: whether the fault the current thread just took (the page-fault event fires
 * once it is handled) mapped a transparent huge page. Only a fault that mapped a huge page
 * leaves its block's PMD holding one: a fault the kernel could not give a huge page (no free
 * 2 MiB, or the block already had base pages) maps a base page under a PMD that points to a
 * page table, however many of the block's pages earlier faults mapped. The huge zero page a read
 * maps is read only and counts as a base page. Anonymous private memory only: file-backed and
 * shared-memory huge pages count as base pages (offcpu.h). */

/* The fields of struct vm_area_struct read here, relocated against the kernel's BTF (CO-RE):
 * the kernel's own names, so that they match. */
struct vm_area_struct {
	void *vm_file;
	unsigned long vm_flags;
} __attribute__((preserve_access_index));

/* bpf_find_vma's callback: whether the fault's mapping is anonymous and private. */
static long anonymous_private(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	__u32 *anonymous = data;
	*anonymous = !vma->vm_file && !(vma->vm_flags & SMOLDER_VM_SHARED);
	return 0;
}

/* SMOLDER_SAMPLE_HUGE when the fault at `addr` mapped a huge page, SMOLDER_SAMPLE_HUGE_UNKNOWN
 * when the page tables could not be read, else 0. */
static __always_inline __u32 huge_flags(__u64 addr)
{
	enum smolder_pmd_kind pmd = current_pmd(addr);
	if (pmd == SMOLDER_PMD_UNREADABLE)
		return SMOLDER_SAMPLE_HUGE_UNKNOWN;
	if (pmd != SMOLDER_PMD_HUGE)
		return 0;
	__u32 anonymous = 0;
	if (bpf_find_vma(bpf_get_current_task_btf(), addr, anonymous_private, &anonymous, 0) ||
	    !anonymous)
		return 0;
	return SMOLDER_SAMPLE_HUGE;
}

SEC("perf_event")
int on_fault(struct bpf_perf_event_data *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	if (tgid == 0 || tgid == self_tgid)
		return 0;
	struct unwind_regs regs;
	/* Kernel threads fault on user memory only through another process's mm: not sampled. */
	if (!sample_user_regs(ctx, &regs) || !is_profiled(tgid))
		return 0;
	struct unwind_scratch *st = scratch(&scratch_fault, SMOLDER_SAMPLE_MEMORY, pid_tgid);
	if (!st)
		return 0;
	st->sample.value = ctx->sample_period;
	st->sample.addr = ctx->addr;
	st->sample.flags = huge_flags(ctx->addr);
	unwind_user(st, &regs, tgid);
	unwind_kernel(ctx, st, 0);
	python_frames(st, pid_tgid);
	unwind_output(st);
	return 0;
}

SEC("uprobe")
int on_uprobe(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	struct unwind_scratch *st = scratch(&scratch_uprobe, SMOLDER_SAMPLE_UPROBE, pid_tgid);
	if (!st)
		return 0;
	struct unwind_regs regs;
	regs_of(ctx, &regs);
	unwind_user(st, &regs, pid_tgid >> 32);
	/* A uprobe fires in user context: no kernel stack. */
	unwind_no_kernel(st);
	python_frames(st, pid_tgid);
	unwind_output(st);
	return 0;
}

/* sched_process_exec and sched_process_exit fire in the context of the task concerned, so the
 * current pid/tgid is the process's own; no tracepoint arguments are read. */

SEC("raw_tp/sched_process_exec")
int on_exec(void *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	__u32 tid = pid_tgid;
	if (tgid == self_tgid)
		return 0;
	/* A new image: whatever CPython state the process had is gone (the agent looks again). */
	bpf_map_delete_elem(&python_procs, &tgid);
	bpf_map_delete_elem(&python_threads, &tid);
	if (bpf_map_delete_elem(&seen, &tgid) == 0)
		send_event(tgid, SMOLDER_EVENT_EXEC);
	return 0;
}

SEC("raw_tp/sched_process_exit")
int on_exit(void *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	__u32 tid = pid_tgid;
	/* A thread id may be reused by a thread of another process: its cached state must go. */
	bpf_map_delete_elem(&python_threads, &tid);
	/* Only the main thread's exit ends the process for the agent; other threads come and go. */
	if (tid != tgid)
		return 0;
	bpf_map_delete_elem(&python_procs, &tgid);
	if (bpf_map_delete_elem(&seen, &tgid) == 0)
		send_event(tgid, SMOLDER_EVENT_EXIT);
	return 0;
}

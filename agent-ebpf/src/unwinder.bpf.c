// SPDX-License-Identifier: GPL-2.0
/* Smolder's sampler: the entry points of the BPF unwinder (unwind.bpf.h) and the process events.
 *
 * on_cpu (perf_event, one per online CPU) sends every tick's user stack, unwound from the
 * .eh_frame tables user space loaded, and its kernel stack, through `unwind_samples`; a process's
 * first sample also puts a FIRST_SIGHT event in `events`, so that user space reads the process
 * and loads its tables. on_exec and on_exit (raw tracepoints) send EXEC and EXIT.
 * on_uprobe (uprobe) unwinds at a probed instruction: the point check of the tests, where the
 * expected call path is known exactly. Both add the Python frames of a thread of a CPython
 * process the agent registered in `python_procs` (python.bpf.h, contract in python.h).
 *
 * Each entry point has its own per-CPU scratch: on_cpu runs in NMI context and can interrupt a
 * uprobe program on the same CPU.
 *
 * The kernel requires a GPL-compatible licence for bpf_get_stack, bpf_loop and the ring buffer
 * helpers.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>

#include "process.h"
#include "unwind.bpf.h"
#include "python.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* The agent's own process, patched in at load time; it is not sampled. */
const volatile __u32 self_tgid = 0;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct unwind_scratch);
} scratch_cpu SEC(".maps"), scratch_uprobe SEC(".maps");

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

/* The user registers of the interrupted task: the sample's own when it interrupted user mode,
 * else those saved at the task's entry into the kernel. 0 when it has none (a kernel thread). */
static __always_inline int sample_user_regs(struct bpf_perf_event_data *ctx, struct unwind_regs *out)
{
	if (user_mode(&ctx->regs)) {
		regs_of(&ctx->regs, out);
		return 1;
	}
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs regs;
	if (bpf_probe_read_kernel(&regs, sizeof(regs), (void *)bpf_task_pt_regs(task)))
		return 0;
	if (!user_mode(&regs))
		return 0;
	regs_of(&regs, out);
	return 1;
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
	st->sample.python_status = SMOLDER_PYTHON_NONE;
	st->sample.python_len = 0;
	return st;
}

SEC("perf_event")
int on_cpu(struct bpf_perf_event_data *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	/* tgid 0 is the idle task. */
	if (tgid == 0 || tgid == self_tgid)
		return 0;
	if (!bpf_map_lookup_elem(&seen, &tgid)) {
		__u8 yes = 1;
		if (bpf_map_update_elem(&seen, &tgid, &yes, BPF_NOEXIST) == 0)
			send_event(tgid, SMOLDER_EVENT_FIRST_SIGHT);
	}
	struct unwind_scratch *st = scratch(&scratch_cpu, SMOLDER_SAMPLE_CPU, pid_tgid);
	if (!st)
		return 0;
	struct unwind_regs regs;
	if (sample_user_regs(ctx, &regs))
		unwind_user(st, &regs, tgid);
	else
		unwind_none(st);
	unwind_kernel(ctx, st);
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

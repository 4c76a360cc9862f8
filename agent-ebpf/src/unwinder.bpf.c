// SPDX-License-Identifier: GPL-2.0
/* Smolder's sampler with whole user stacks: the entry points of the BPF unwinder (unwind.bpf.h).
 *
 * on_cpu (perf_event, one per online CPU) sends every tick's user stack, unwound from the
 * .eh_frame tables user space loaded, with its kernel stack id, through `unwind_samples`.
 * on_uprobe (uprobe) does the same at a probed instruction: the point check of the tests, where
 * the expected call path is known exactly.
 *
 * Each entry point has its own per-CPU scratch: on_cpu runs in NMI context and can interrupt a
 * uprobe program on the same CPU.
 *
 * The kernel requires a GPL-compatible licence for bpf_get_stackid, bpf_loop and the ring
 * buffer helpers.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>

#include "unwind.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* The agent's own process, patched in at load time; it is not sampled. */
const volatile __u32 self_tgid = 0;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct unwind_scratch);
} scratch_cpu SEC(".maps"), scratch_uprobe SEC(".maps");

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
	struct unwind_scratch *st = scratch(&scratch_cpu, SMOLDER_SAMPLE_CPU, pid_tgid);
	if (!st)
		return 0;
	st->sample.kernel_stack_id = bpf_get_stackid(ctx, &unwind_kstacks, 0);
	struct unwind_regs regs;
	if (sample_user_regs(ctx, &regs))
		unwind_user(st, &regs, tgid);
	else
		unwind_none(st);
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
	/* A uprobe fires in user context: no kernel stack. */
	st->sample.kernel_stack_id = -14; /* -EFAULT, as bpf_get_stackid reports it */
	struct unwind_regs regs;
	regs_of(ctx, &regs);
	unwind_user(st, &regs, pid_tgid >> 32);
	unwind_output(st);
	return 0;
}

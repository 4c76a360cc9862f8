/* The off-CPU and memory-growth contract between the agent's BPF object (unwinder.bpf.c) and
 * user space (agent-ebpf/src/lib.rs mirrors it).
 *
 * Off-CPU: `on_switch` (tp_btf/sched_switch) unwinds a user thread that leaves the CPU, when
 * a per-CPU xorshift32 number (1 to 2^32-1, seeded by bpf_get_prandom_u32) <=
 * offcpu_config.threshold, and sends an OFF_CPU (blocked) or
 * RUN_QUEUE (preempted while runnable) sample whose value is the switch-out time (ktime ns,
 * CLOCK_MONOTONIC) and whose threshold is the one it was sampled with; it remembers that time
 * in the thread's task storage. When the thread runs again the same program sends an
 * OFF_CPU_END sample (no frames, value = switch-in time) and forgets it. User space joins the
 * two by thread id and weights the duration by 1 / probability (probability = threshold /
 * 2^32-1; SMOLDER_OFF_CPU_ALWAYS samples every switch).
 *
 * Both sample only processes in `profiled` (HASH tgid -> 1), which user space fills with the
 * processes its relabelling keeps; the sampling decision (random number, or the fault counter)
 * comes first and is the same for every process, so weights stay unbiased.
 *
 * Memory growth: `on_fault` (perf_event, software event page-faults-min, one sample every
 * `period` faults per CPU) sends a MEMORY sample (value = period, addr = the faulting address)
 * with SMOLDER_SAMPLE_HUGE when the fault mapped a transparent huge page: once the fault is
 * handled, the PMD of its 2 MiB block maps a writable huge page, in an anonymous private
 * mapping (pagetable.bpf.h reads the page tables). A fault that fell back to base pages leaves
 * a page table there, however much of the block earlier faults mapped. With
 * SMOLDER_SAMPLE_HUGE_UNKNOWN instead when the page tables could not be read (the kernel's
 * direct map was not found): the sample counts as a base page. File-backed, shared-memory and
 * hugetlbfs huge pages and multi-size (mTHP) folios count as base pages.
 */
#ifndef SMOLDER_OFFCPU_H
#define SMOLDER_OFFCPU_H

/* offcpu_config.threshold that samples every switch. */
#define SMOLDER_OFF_CPU_ALWAYS 0xffffffffu

/* The task states of sched_switch's prev_state (include/linux/sched.h). */
#define SMOLDER_TASK_RUNNING 0x0000
#define SMOLDER_TASK_DEAD 0x0080

/* The flags of offcpu_config. */
#define SMOLDER_OFF_CPU_RUN_QUEUE 1 /* also sample threads preempted while runnable */

/* The one entry of the `offcpu_config` array. 8 bytes, no padding. */
struct offcpu_config {
	__u32 threshold; /* sample a switch when the random number <= this; 0: never */
	__u32 flags;     /* SMOLDER_OFF_CPU_* */
};

/* What `offcpu_pending` (task storage) keeps of a thread sampled at switch-out. 16 bytes. */
struct offcpu_pending {
	__u64 start; /* switch-out ktime; 0 once the switch-in was sent */
	__u32 tgid;
	__u32 tid;
};

/* vm_area_struct.vm_flags: a shared mapping (include/linux/mm.h). */
#define SMOLDER_VM_SHARED 0x00000008ul

/* Kernel frames a tracing program's own stack adds under the kernel stack it reads:
 * the program and bpf_trace_run4. */
#define SMOLDER_SWITCH_SKIP_FRAMES 2

/* The huge page a PMD maps on x86-64. */
#define SMOLDER_HUGE_PAGE_SHIFT 21

_Static_assert(sizeof(struct offcpu_config) == 8, "offcpu_config is 8 bytes");
_Static_assert(sizeof(struct offcpu_pending) == 16, "offcpu_pending is 16 bytes");

#endif

// SPDX-License-Identifier: GPL-2.0
/* Smolder's CPU sampler: on every tick of the software cpu-clock event (one per online CPU, at
 * the agent's frequency) it counts the running process's user and kernel stacks.
 *
 * Samples go to one of two buffers (counts_N + stacks_N), chosen by the `buffer` map: the agent
 * flips it, waits for programs in flight to finish and drains the idle buffer at leisure, so no
 * sample is read twice or deleted unread. Processes are announced once through the `events` ring
 * buffer when first sampled, and again when they exec or exit, so the agent can capture their
 * memory maps while they are alive.
 *
 * Samples of CPython processes the agent registered in `python_procs` carry their Python stack
 * instead of the user stack (python.bpf.h, contract in python.h).
 *
 * The kernel requires a GPL-compatible licence for bpf_get_stackid and the ring buffer helpers.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>

#include "sampler.h"
#include "python.bpf.h"

#define EEXIST 17
#define EFAULT 14

char LICENSE[] SEC("license") = "GPL";

/* The agent's own process, patched in at load time; its samples are not counted. */
const volatile __u32 self_tgid = 0;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} buffer SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SMOLDER_COUNTS_ENTRIES);
	__type(key, struct sample_key);
	__type(value, __u64);
} counts_0 SEC(".maps"), counts_1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, SMOLDER_STACKS_ENTRIES);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, SMOLDER_MAX_STACK_DEPTH * sizeof(__u64));
} stacks_0 SEC(".maps"), stacks_1 SEC(".maps");

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

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SMOLDER_ERR_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} errors SEC(".maps");

static __always_inline void count_error(__u32 index)
{
	__u64 *value = bpf_map_lookup_elem(&errors, &index);
	if (value)
		*value += 1; /* per-CPU slot: no other writer */
}

static __always_inline void send_event(__u32 tgid, __u32 kind)
{
	struct process_event event = { .tgid = tgid, .kind = kind };
	if (bpf_ringbuf_output(&events, &event, sizeof(event), 0))
		count_error(SMOLDER_ERR_EVENTS_LOST);
}

static __always_inline __s32 stack_id(long id, __u32 collision, __u32 other)
{
	if (id == -EEXIST)
		count_error(collision);
	else if (id < 0 && id != -EFAULT)
		count_error(other);
	return (__s32)id;
}

static __always_inline void count_sample(struct bpf_perf_event_data *ctx, void *counts,
					 void *stacks, void *python_stacks, __u32 buffer,
					 __u64 pid_tgid)
{
	__u32 tgid = pid_tgid >> 32;
	struct sample_key key = { .tgid = tgid, .user_stack_id = -EFAULT };
	struct python_proc *proc = bpf_map_lookup_elem(&python_procs, &tgid);
	if (proc) {
		__u32 zero = 0;
		struct python_scratch *scratch = bpf_map_lookup_elem(&python_scratch, &zero);
		if (scratch) {
			struct python_stack_key python = {};
			key.python_status = python_stack(proc, scratch, tgid, (__u32)pid_tgid, buffer,
							 python_stacks, &python);
			key.python_len = python.len;
			key.python_hash = python.hash;
		}
	}
	/* A Python stack stands for the user stack (Python-only stacks). */
	if (key.python_status != SMOLDER_PYTHON_OK && key.python_status != SMOLDER_PYTHON_TRUNCATED)
		/* BPF_F_FAST_STACK_CMP: equal hashes are the same stack, without comparing frames. */
		key.user_stack_id = stack_id(bpf_get_stackid(ctx, stacks,
							     BPF_F_USER_STACK | BPF_F_FAST_STACK_CMP),
					     SMOLDER_ERR_USER_STACK_COLLISION,
					     SMOLDER_ERR_USER_STACK_OTHER);
	key.kernel_stack_id = stack_id(bpf_get_stackid(ctx, stacks, BPF_F_FAST_STACK_CMP),
				       SMOLDER_ERR_KERNEL_STACK_COLLISION,
				       SMOLDER_ERR_KERNEL_STACK_OTHER);

	__u64 *count = bpf_map_lookup_elem(counts, &key);
	if (count) {
		__sync_fetch_and_add(count, 1);
		return;
	}
	__u64 one = 1;
	if (bpf_map_update_elem(counts, &key, &one, BPF_NOEXIST) == 0)
		return;
	/* Another CPU inserted the key between lookup and update, or the map is full. */
	count = bpf_map_lookup_elem(counts, &key);
	if (count)
		__sync_fetch_and_add(count, 1);
	else
		count_error(SMOLDER_ERR_COUNTS_FULL);
}

SEC("perf_event")
int on_sample(struct bpf_perf_event_data *ctx)
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

	__u32 zero = 0;
	__u32 *active = bpf_map_lookup_elem(&buffer, &zero);
	if (active && *active == 1)
		count_sample(ctx, &counts_1, &stacks_1, &python_stacks_1, 1, pid_tgid);
	else
		count_sample(ctx, &counts_0, &stacks_0, &python_stacks_0, 0, pid_tgid);
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

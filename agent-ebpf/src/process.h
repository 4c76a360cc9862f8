/* The process-event contract between the agent's BPF object (unwinder.bpf.c) and user space
 * (agent-ebpf/src/lib.rs mirrors it): processes announced when first sampled, when they exec and
 * when they exit, so that the agent reads their labels and memory maps while they are alive.
 */
#ifndef SMOLDER_PROCESS_H
#define SMOLDER_PROCESS_H

/* Default map sizes. */
#define SMOLDER_SEEN_ENTRIES 65536
#define SMOLDER_EVENTS_BYTES (256 * 1024)

/* Kinds of process event sent through the `events` ring buffer. */
enum smolder_event_kind {
	/* The first sample of a process (or the first after the `seen` LRU forgot it). */
	SMOLDER_EVENT_FIRST_SIGHT = 1,
	/* The process called execve: its memory map and name changed. */
	SMOLDER_EVENT_EXEC = 2,
	/* The process's main thread exited. */
	SMOLDER_EVENT_EXIT = 3,
};

/* One entry of the `events` ring buffer. 8 bytes, no padding. */
struct process_event {
	__u32 tgid;
	__u32 kind;
};

_Static_assert(sizeof(struct process_event) == 8, "process_event is 8 bytes");

#endif

/* The BPF walk of CPython stacks, included by unwinder.bpf.c after unwind.bpf.h. The contract
 * (maps, structs, how a thread state is found) is python.h. The caller passes its own
 * unwind_scratch, whose sample already holds the user and kernel frames: python_walk appends
 * the Python frames after them and sets python_status and python_len, so that unwind_output
 * sends all three in one record.
 *
 * Both walks use bpf_loop: the thread lookup visits at most SMOLDER_PYTHON_MAX_THREAD_WALK list
 * entries, the frame walk at most SMOLDER_PYTHON_MAX_FRAMES frames plus a shim per frame. Every
 * pointer followed is process memory read with bpf_probe_read_user: a process that frees or
 * corrupts its lists makes a read fail, never the program.
 */
#ifndef SMOLDER_PYTHON_BPF_H
#define SMOLDER_PYTHON_BPF_H

#include "python.h"
#include "unwind.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SMOLDER_PYTHON_PROCS_ENTRIES);
	__type(key, __u32);
	__type(value, struct python_proc);
} python_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SMOLDER_PYTHON_THREADS_ENTRIES);
	__type(key, __u32);
	__type(value, struct python_thread);
} python_threads SEC(".maps");

static __always_inline int python_read(__u64 *out, __u64 addr)
{
	return bpf_probe_read_user(out, sizeof(*out), (const void *)addr);
}

/* The current frame of thread state `tstate` into *frame (0: none). 0, or -1 when unreadable. */
static __always_inline int python_current_frame(__u16 tstate_frame, __u16 cframe_current_frame,
						 __u64 tstate, __u64 *frame)
{
	__u64 anchor = 0;
	if (python_read(&anchor, tstate + tstate_frame))
		return -1;
	if (cframe_current_frame == SMOLDER_PYTHON_NO_OFFSET || anchor == 0) {
		*frame = anchor;
		return 0;
	}
	/* 3.11, 3.12: the anchor is the innermost eval-loop call's _PyCFrame. */
	return python_read(frame, anchor + cframe_current_frame);
}

/* The thread lookup's state, on the caller's stack: plain offsets, no pointers. */
struct python_thread_walk {
	__u64 interp;
	__u64 tstate;
	__u64 found;       /* the first state of the thread that runs Python code */
	__u64 found_frame; /* its current frame */
	__u64 fallback;    /* the first state of the thread */
	__u32 tid;         /* in the process's PID namespace */
	__u32 status;      /* 0 while walking, else SMOLDER_PYTHON_* or 1 when done */
	__u16 interp_next;
	__u16 interp_threads_head;
	__u16 tstate_next;
	__u16 tstate_native_thread_id;
	__u16 tstate_frame;
	__u16 cframe_current_frame;
};

#define SMOLDER_WALK_DONE 1

static long python_thread_step(__u32 index, void *ctx)
{
	struct python_thread_walk *w = ctx;
	if (w->tstate == 0) {
		/* The end of one interpreter's list: on to the next interpreter. */
		if (python_read(&w->interp, w->interp + w->interp_next))
			goto failed;
		if (w->interp == 0) {
			w->status = SMOLDER_WALK_DONE;
			return 1;
		}
		if (python_read(&w->tstate, w->interp + w->interp_threads_head))
			goto failed;
		return 0;
	}
	__u64 id = 0;
	if (python_read(&id, w->tstate + w->tstate_native_thread_id))
		goto failed;
	if (id == w->tid) {
		__u64 frame = 0;
		if (python_current_frame(w->tstate_frame, w->cframe_current_frame, w->tstate, &frame))
			goto failed;
		if (frame) {
			w->found = w->tstate;
			w->found_frame = frame;
			w->status = SMOLDER_WALK_DONE;
			return 1;
		}
		if (!w->fallback)
			w->fallback = w->tstate;
	}
	if (python_read(&w->tstate, w->tstate + w->tstate_next))
		goto failed;
	return 0;
failed:
	w->status = SMOLDER_PYTHON_READ_THREAD;
	return 1;
}

/* The current frame of the sampled thread `tid` (root namespace) into *frame; returns
 * SMOLDER_PYTHON_OK or why there is none. */
static __always_inline __u32 python_find_frame(struct python_proc *proc, __u32 tid, __u64 *frame)
{
	struct bpf_pidns_info ns = {};
	if (bpf_get_ns_current_pid_tgid(proc->pidns_dev, proc->pidns_ino, &ns, sizeof(ns)))
		return SMOLDER_PYTHON_NO_THREAD;
	__u64 now = bpf_ktime_get_ns();
	struct python_thread *cached = bpf_map_lookup_elem(&python_threads, &tid);
	if (cached) {
		__u64 tstate = cached->tstate;
		int fresh = now - cached->walked_ns < SMOLDER_PYTHON_REWALK_NS;
		if (tstate) {
			__u64 id = 0;
			/* Still this thread's state (not freed and reused for another thread)? */
			if (python_read(&id, tstate + proc->tstate_native_thread_id) == 0 &&
			    id == ns.pid) {
				if (python_current_frame(proc->tstate_frame, proc->cframe_current_frame,
							 tstate, frame))
					return SMOLDER_PYTHON_READ_THREAD;
				if (*frame)
					return SMOLDER_PYTHON_OK;
				if (fresh)
					return SMOLDER_PYTHON_NO_FRAMES;
			}
		} else if (fresh) {
			return SMOLDER_PYTHON_NO_THREAD;
		}
	}

	struct python_thread_walk w = {
		.tid = ns.pid,
		.interp_next = proc->interp_next,
		.interp_threads_head = proc->interp_threads_head,
		.tstate_next = proc->tstate_next,
		.tstate_native_thread_id = proc->tstate_native_thread_id,
		.tstate_frame = proc->tstate_frame,
		.cframe_current_frame = proc->cframe_current_frame,
	};
	if (python_read(&w.interp, proc->interpreters_head))
		return SMOLDER_PYTHON_READ_THREAD;
	/* Not initialised yet: nothing to cache, the runtime may come up any moment. */
	if (w.interp == 0)
		return SMOLDER_PYTHON_NO_THREAD;
	if (python_read(&w.tstate, w.interp + w.interp_threads_head))
		return SMOLDER_PYTHON_READ_THREAD;
	bpf_loop(SMOLDER_PYTHON_MAX_THREAD_WALK, python_thread_step, &w, 0);
	if (w.status == SMOLDER_PYTHON_READ_THREAD)
		return SMOLDER_PYTHON_READ_THREAD;
	if (w.status != SMOLDER_WALK_DONE)
		return SMOLDER_PYTHON_THREAD_LIMIT;
	struct python_thread found = {
		.tstate = w.found ? w.found : w.fallback,
		.walked_ns = now,
	};
	bpf_map_update_elem(&python_threads, &tid, &found, BPF_ANY);
	if (w.found) {
		*frame = w.found_frame;
		return SMOLDER_PYTHON_OK;
	}
	return w.fallback ? SMOLDER_PYTHON_NO_FRAMES : SMOLDER_PYTHON_NO_THREAD;
}

/* Words of the scratch's frames array: user, kernel, then Python frames. */
#define SMOLDER_PYTHON_SCRATCH_WORDS                                                        \
	(SMOLDER_UNWIND_MAX_FRAMES + SMOLDER_UNWIND_KERNEL_FRAMES + SMOLDER_UNWIND_PYTHON_WORDS)

/* The frame walk's state, on the caller's stack. */
struct python_frame_walk {
	struct unwind_scratch *st;
	__u64 frame;
	__u32 base;   /* the word of st->frames where the Python frames start */
	__u32 len;
	__u32 status; /* 0 while walking, else SMOLDER_PYTHON_OK, _TRUNCATED or _READ_FRAME */
	__u16 frame_previous;
	__u16 frame_code;
	__u16 frame_instr;
	__u16 frame_owner;
	__u8 shim_owner;
	__u8 frame_is_entry;
	__u8 pad[2];
};

/* Offsets into the frame copy are masked to its buffer (the agent checks that every field lies
 * within SMOLDER_PYTHON_FRAME_READ bytes). */
#define SMOLDER_FRAME_FIELD(st, offset) (*(__u64 *)((st)->python_frame + ((offset) & 127)))

/* The word of st->frames where Python frame `index` starts, or -1 past the array. */
static __always_inline long python_slot(__u32 base, __u32 index)
{
	__u64 word = (__u64)base + 2 * (__u64)index;
	if (word > SMOLDER_PYTHON_SCRATCH_WORDS - 2)
		return -1;
	return word;
}

static long python_frame_step(__u32 index, void *ctx)
{
	struct python_frame_walk *w = ctx;
	struct unwind_scratch *st = w->st;
	if (w->frame == 0) {
		w->status = SMOLDER_PYTHON_OK;
		return 1;
	}
	if (bpf_probe_read_user(st->python_frame, SMOLDER_PYTHON_FRAME_READ,
				(const void *)w->frame)) {
		w->status = SMOLDER_PYTHON_READ_FRAME;
		return 1;
	}
	__u8 owner = st->python_frame[w->frame_owner & 127];
	__u32 len = w->len;
	if (owner == w->shim_owner) {
		/* A shim below the frame just recorded: that frame was an interpreter-loop call's
		 * first. */
		long slot = len > 0 ? python_slot(w->base, len - 1) : -1;
		if (slot >= 0 && slot <= SMOLDER_PYTHON_SCRATCH_WORDS - 2)
			st->frames[slot] |= SMOLDER_PYTHON_ENTRY;
	} else {
		if (len >= SMOLDER_PYTHON_MAX_FRAMES) {
			w->status = SMOLDER_PYTHON_TRUNCATED;
			return 1;
		}
		long slot = python_slot(w->base, len);
		if (slot < 0 || slot > SMOLDER_PYTHON_SCRATCH_WORDS - 2) {
			w->status = SMOLDER_PYTHON_TRUNCATED;
			return 1;
		}
		__u64 code = SMOLDER_FRAME_FIELD(st, w->frame_code);
		if (w->frame_is_entry != SMOLDER_PYTHON_NO_SHIM &&
		    st->python_frame[w->frame_is_entry & 127])
			code |= SMOLDER_PYTHON_ENTRY;
		st->frames[slot] = code;
		st->frames[slot + 1] = SMOLDER_FRAME_FIELD(st, w->frame_instr);
		w->len = len + 1;
	}
	w->frame = SMOLDER_FRAME_FIELD(st, w->frame_previous);
	return 0;
}

/* Appends the Python frames of the sampled thread `tid` (root namespace) of CPython process
 * `proc` after the sample's user and kernel frames, and sets python_status and python_len. */
static __always_inline void python_walk(struct unwind_scratch *st, struct python_proc *proc,
					__u32 tid)
{
	st->sample.python_len = 0;
	__u64 frame = 0;
	__u32 status = python_find_frame(proc, tid, &frame);
	if (status != SMOLDER_PYTHON_OK) {
		st->sample.python_status = status;
		return;
	}
	__u32 len = st->sample.len;
	if (len > SMOLDER_UNWIND_MAX_FRAMES)
		len = SMOLDER_UNWIND_MAX_FRAMES;
	__u32 kernel_len = st->sample.kernel_len;
	if (kernel_len > SMOLDER_UNWIND_KERNEL_FRAMES)
		kernel_len = SMOLDER_UNWIND_KERNEL_FRAMES;
	struct python_frame_walk w = {
		.st = st,
		.frame = frame,
		.base = len + kernel_len,
		.frame_previous = proc->frame_previous,
		.frame_code = proc->frame_code,
		.frame_instr = proc->frame_instr,
		.frame_owner = proc->frame_owner,
		.shim_owner = proc->shim_owner,
		.frame_is_entry = proc->frame_is_entry,
	};
	/* A shim below every frame at most, and one more step to see the end. */
	bpf_loop(2 * SMOLDER_PYTHON_MAX_FRAMES + 2, python_frame_step, &w, 0);
	if (w.status == SMOLDER_PYTHON_READ_FRAME) {
		st->sample.python_status = SMOLDER_PYTHON_READ_FRAME;
		return;
	}
	if (w.len == 0) {
		st->sample.python_status = SMOLDER_PYTHON_NO_FRAMES;
		return;
	}
	st->sample.python_len = w.len > SMOLDER_PYTHON_MAX_FRAMES ? SMOLDER_PYTHON_MAX_FRAMES : w.len;
	st->sample.python_status =
		w.status == SMOLDER_PYTHON_OK ? SMOLDER_PYTHON_OK : SMOLDER_PYTHON_TRUNCATED;
}

#endif

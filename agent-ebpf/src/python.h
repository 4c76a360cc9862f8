/* The contract between the BPF walk of CPython stacks (python.bpf.h, called by unwinder.bpf.c's
 * entry points after the native walk) and the agent (agent/src/ebpf/python/).
 * agent-ebpf/src/lib.rs mirrors every struct here with #[repr(C)], an aya::Pod impl and a size
 * assertion; keep the two in step.
 *
 * The agent detects CPython processes and writes one `python_procs` entry per process: where
 * `_PyRuntime.interpreters.head` lives and the offsets of the fields the walk reads. For a sample
 * of such a process, the walk finds the sampled thread's PyThreadState, follows its frames from
 * the current one to the first, and records each frame's code object and instruction pointer.
 * The sample (unwind.h) carries them after its kernel frames: `python_len` struct python_frame,
 * innermost first, and `python_status` says what the walk found. The agent mixes them into the
 * native stack: each native _PyEval_EvalFrameDefault frame gives way to the Python frames it ran.
 *
 * Finding the thread state: the interpreter's own lists, not glibc's thread-specific data. The
 * walk follows `interpreters.head`, each interpreter's `threads.head` and each state's `next`
 * (bounded by SMOLDER_PYTHON_MAX_THREAD_WALK, with bpf_loop) and picks the state whose
 * `native_thread_id` is the sampled thread's id in the process's PID namespace
 * (bpf_get_ns_current_pid_tgid; containers see their own ids), preferring one that runs Python
 * code (a thread that entered a subinterpreter has a state in each). What it found is cached per
 * thread in `python_threads` and checked on every use (the cached state must still carry the
 * thread's id); a thread without a state is looked for again after SMOLDER_PYTHON_REWALK_NS.
 * This needs no knowledge of libc (no TSD layout, no TLS offsets) and costs one list walk per
 * thread.
 */
#ifndef SMOLDER_PYTHON_H
#define SMOLDER_PYTHON_H

/* Python frames a stack holds; deeper stacks keep their innermost frames and are marked
 * truncated. */
#define SMOLDER_PYTHON_MAX_FRAMES 128
/* Thread states and interpreters a thread lookup visits at most. */
#define SMOLDER_PYTHON_MAX_THREAD_WALK 256
/* How long a thread without a thread state (or without frames) waits before the next lookup. */
#define SMOLDER_PYTHON_REWALK_NS 1000000000ULL
/* Bytes of a _PyInterpreterFrame read per frame: every field the walk needs lies below. */
#define SMOLDER_PYTHON_FRAME_READ 72
/* The walk's copy of a frame: SMOLDER_PYTHON_FRAME_READ bytes, room for masked offsets. */
#define SMOLDER_PYTHON_FRAME_BUF 136
/* An offset that does not apply (cframe_current_frame in 3.13). */
#define SMOLDER_PYTHON_NO_OFFSET 0xffff
/* shim_owner of releases without shim frames (3.11). */
#define SMOLDER_PYTHON_NO_SHIM 0xff

/* Default map sizes; the agent may override them at load time. */
#define SMOLDER_PYTHON_PROCS_ENTRIES 4096
#define SMOLDER_PYTHON_THREADS_ENTRIES 8192

/* What the walk found for a sample: the python_status of its header (unwind.h). */
enum smolder_python_status {
	SMOLDER_PYTHON_NONE = 0,         /* not a CPython process the agent walks */
	SMOLDER_PYTHON_OK = 1,           /* the sample carries the Python frames */
	SMOLDER_PYTHON_TRUNCATED = 2,    /* the same, cut at SMOLDER_PYTHON_MAX_FRAMES frames */
	SMOLDER_PYTHON_NO_THREAD = 3,    /* the thread has no thread state (not a Python thread) */
	SMOLDER_PYTHON_NO_FRAMES = 4,    /* the thread runs no Python code */
	SMOLDER_PYTHON_READ_THREAD = 5,  /* reading the interpreter's lists failed */
	SMOLDER_PYTHON_READ_FRAME = 6,   /* reading a frame failed */
	SMOLDER_PYTHON_THREAD_LIMIT = 7, /* the lists are longer than the walk allows */
	SMOLDER_PYTHON_STATUS_COUNT = 8,
};

/* Value of `python_procs` (key: tgid): one CPython process. Offsets are bytes into CPython's
 * structs (agent/src/ebpf/python/layout.rs). 48 bytes, no padding. */
struct python_proc {
	__u64 interpreters_head; /* address of _PyRuntime.interpreters.head */
	__u64 pidns_dev;         /* the process's PID namespace, for bpf_get_ns_current_pid_tgid */
	__u64 pidns_ino;
	__u16 interp_next;          /* PyInterpreterState.next */
	__u16 interp_threads_head;  /* PyInterpreterState.threads.head */
	__u16 tstate_next;          /* PyThreadState.next */
	__u16 tstate_native_thread_id;
	__u16 tstate_frame;         /* current_frame (3.13) or cframe (3.11, 3.12) */
	__u16 cframe_current_frame; /* _PyCFrame.current_frame, or SMOLDER_PYTHON_NO_OFFSET */
	__u16 frame_previous;       /* _PyInterpreterFrame.previous */
	__u16 frame_code;           /* f_code or f_executable */
	__u16 frame_instr;          /* prev_instr or instr_ptr */
	__u16 frame_owner;          /* owner (a char) */
	__u8 shim_owner;            /* owner of shim frames (skipped), or SMOLDER_PYTHON_NO_SHIM */
	__u8 frame_is_entry;        /* is_entry (3.11), or SMOLDER_PYTHON_NO_SHIM */
	__u8 reserved[2];
};

/* Value of `python_threads` (key: the thread's id in the root PID namespace). 16 bytes. */
struct python_thread {
	__u64 tstate;    /* the thread state found, 0 when none was */
	__u64 walked_ns; /* when the lists were last walked for this thread */
};

/* Bit 0 of python_frame.code (code objects are at least 8-byte aligned): the frame is an entry
 * frame, the first one a C-level call of the interpreter loop runs (3.11's is_entry; from 3.12
 * the frame above a shim). In a mixed stack, native frames sit between it and its caller: each
 * native _PyEval_EvalFrameDefault frame ran the Python frames up to and including one. */
#define SMOLDER_PYTHON_ENTRY 1ULL

/* One Python frame. 16 bytes. */
struct python_frame {
	__u64 code;  /* the code object's address, | SMOLDER_PYTHON_ENTRY for an entry frame */
	__u64 instr; /* the frame's instruction pointer (prev_instr or instr_ptr) */
};

_Static_assert(sizeof(struct python_proc) == 48, "python_proc is 48 bytes");
_Static_assert(sizeof(struct python_thread) == 16, "python_thread is 16 bytes");
_Static_assert(sizeof(struct python_frame) == 16, "python_frame is 16 bytes");

#endif

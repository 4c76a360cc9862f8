/* A victim for the unwinder's oracle test: main and two threads recurse to a known depth, sort
 * through libc's qsort with a comparator that burns CPU, and a SIGPROF handler writes snapshots
 * of real stacks: the handler's own registers (captured in place), the interrupted registers
 * from the ucontext, and the stack bytes from the handler's rsp to the top of the thread's stack.
 * The test unwinds every snapshot with the evaluator and checks the frames against the call path
 * below. Built with gcc -O2 -fomit-frame-pointer: no frame pointers anywhere.
 *
 * Usage: snapshot OUT_FILE MAPS_FILE COUNT
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define DEPTH 5
#define MAGIC 0x70616e73646c6f6dULL /* "moldsnap" */

struct snapshot {
	uint64_t magic;
	uint64_t is_main;
	uint64_t rip, rsp, rbp;    /* the handler's own registers */
	uint64_t irip, irsp, irbp; /* the interrupted registers */
	uint64_t len;              /* stack bytes that follow, from rsp */
};

extern void *__libc_stack_end;
static int out_fd;
static int wanted;
static volatile int taken;
static volatile int done;
static __thread uint64_t stack_top;
static __thread int is_main;
static __thread int slot;
/* One buffer per thread, outside TLS: glibc puts static TLS at the top of a thread's stack. */
static char bufs[3][96 * 1024];

static void handler(int sig, siginfo_t *info, void *context)
{
	(void)sig;
	(void)info;
	ucontext_t *uc = context;
	uint64_t rip, rsp, rbp;
	__asm__ volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2"
			 : "=r"(rip), "=r"(rsp), "=r"(rbp));
	if (done || stack_top == 0 || stack_top <= rsp)
		return;
	struct snapshot s = {
		.magic = MAGIC,
		.is_main = is_main,
		.rip = rip,
		.rsp = rsp,
		.rbp = rbp,
		.irip = uc->uc_mcontext.gregs[REG_RIP],
		.irsp = uc->uc_mcontext.gregs[REG_RSP],
		.irbp = uc->uc_mcontext.gregs[REG_RBP],
		.len = stack_top - rsp,
	};
	char *buf = bufs[slot];
	if (sizeof(s) + s.len > sizeof(bufs[0]))
		return;
	memcpy(buf, &s, sizeof(s));
	memcpy(buf + sizeof(s), (void *)rsp, s.len);
	if (write(out_fd, buf, sizeof(s) + s.len) != (ssize_t)(sizeof(s) + s.len))
		_exit(3);
	if (__atomic_add_fetch(&taken, 1, __ATOMIC_SEQ_CST) >= wanted)
		done = 1;
}

volatile uint64_t sink;

__attribute__((noinline)) static uint64_t burn(uint64_t x)
{
	for (int i = 0; i < 2000; i++)
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
	sink = x;
	return x;
}

__attribute__((noinline)) static int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	burn(x ^ y);
	return (x > y) - (x < y);
}

__attribute__((noinline)) static uint64_t sort_it(void)
{
	uint64_t values[512];
	for (int i = 0; i < 512; i++)
		values[i] = (uint64_t)(i * 7919 % 512);
	qsort(values, 512, sizeof(values[0]), cmp);
	return values[0] + values[511];
}

__attribute__((noinline)) static uint64_t recurse(int depth)
{
	if (depth == 0) {
		uint64_t total = 0;
		while (!done)
			total += sort_it();
		return total;
	}
	/* The store after the call keeps the call a call (no tail recursion into a loop). */
	uint64_t r = recurse(depth - 1);
	sink = r;
	return r + (uint64_t)depth;
}

/* A timer on the calling thread's CPU clock that signals that thread: process-wide timers
 * (setitimer) would mostly interrupt the main thread. */
static void start_timer(void)
{
	struct sigevent ev = { .sigev_notify = SIGEV_THREAD_ID, .sigev_signo = SIGPROF };
	ev._sigev_un._tid = (pid_t)syscall(SYS_gettid); /* sigev_notify_thread_id */
	timer_t timer;
	struct itimerspec spec = { .it_interval = { 0, 1000000 }, .it_value = { 0, 1000000 } };
	if (timer_create(CLOCK_THREAD_CPUTIME_ID, &ev, &timer) || timer_settime(timer, 0, &spec, NULL))
		_exit(4);
}

static void *worker(void *arg)
{
	slot = (int)(intptr_t)arg;
	pthread_attr_t attr;
	void *addr;
	size_t size;
	pthread_getattr_np(pthread_self(), &attr);
	pthread_attr_getstack(&attr, &addr, &size);
	stack_top = (uint64_t)addr + size;
	start_timer();
	sink = recurse(DEPTH);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	out_fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
	wanted = atoi(argv[3]);
	if (out_fd < 0 || wanted <= 0)
		return 2;
	stack_top = (uint64_t)__libc_stack_end + 256;
	is_main = 1;
	struct sigaction sa = { .sa_sigaction = handler, .sa_flags = SA_SIGINFO | SA_RESTART };
	sigaction(SIGPROF, &sa, NULL);

	pthread_t threads[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&threads[i], NULL, worker, (void *)(intptr_t)(i + 1));

	/* The memory map once every thread is up, for the test to find the executables. */
	static char maps[256 * 1024];
	int in = open("/proc/self/maps", O_RDONLY);
	size_t len = 0;
	ssize_t n;
	while (in >= 0 && len < sizeof(maps) && (n = read(in, maps + len, sizeof(maps) - len)) > 0)
		len += n;
	int out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (in < 0 || len == 0 || out < 0 || write(out, maps, len) != (ssize_t)len)
		return 2;
	close(out);

	start_timer();
	sink = recurse(DEPTH);
	for (int i = 0; i < 2; i++)
		pthread_join(threads[i], NULL);
	return 0;
}

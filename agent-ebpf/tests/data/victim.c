/* A victim for the BPF unwinder's tests, built with gcc -O2 -fomit-frame-pointer: main and one
 * thread recurse DEPTH calls deep, then sort through libc's qsort forever with a comparator that
 * calls burn(), where the point check's uprobe sits. It waits for a line on stdin before it
 * starts, so that the test can load its tables and attach first.
 *
 * Modes: "plain"; "syscalls" (the loop also makes system calls through the PLT, so that
 * cpu-clock samples land in the kernel and in PLT stubs); "signal" (a SIGALRM handler, every
 * millisecond, calls handler_work() on the main thread, where a uprobe sees the stack through the
 * signal frame).
 *
 * Usage: victim DEPTH [MODE]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static int depth;
static int syscalls_too;
volatile uint64_t sink;

__attribute__((noipa)) uint64_t burn(uint64_t x)
{
	for (int i = 0; i < 300; i++)
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
	sink = x;
	return x;
}

__attribute__((noipa)) int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	burn(x ^ y);
	return (x > y) - (x < y);
}

__attribute__((noipa)) uint64_t sort_it(void)
{
	uint64_t values[512];
	for (int i = 0; i < 512; i++)
		values[i] = (uint64_t)(i * 7919 % 512);
	qsort(values, 512, sizeof(values[0]), cmp);
	return values[0] + values[511];
}

__attribute__((noipa)) uint64_t syscalls(void)
{
	uint64_t total = 0;
	for (int i = 0; i < 20000; i++)
		total += (uint64_t)getppid();
	return total;
}

__attribute__((noipa)) void handler_work(void)
{
	burn(1);
}

__attribute__((noipa)) void on_alarm(int sig)
{
	(void)sig;
	handler_work();
	sink += 1; /* not a tail call: the handler keeps its frame */
}

__attribute__((noipa)) uint64_t recurse(int d)
{
	if (d == 0) {
		uint64_t total = 0;
		for (;;) {
			total += sort_it();
			if (syscalls_too)
				total += syscalls();
		}
		return total;
	}
	/* The store after the call keeps the call a call (no tail recursion into a loop). */
	uint64_t r = recurse(d - 1);
	sink = r;
	return r + (uint64_t)d;
}

static void *worker(void *arg)
{
	(void)arg;
	sink = recurse(depth);
	return NULL;
}

int main(int argc, char **argv)
{
	char line[16];
	if (argc < 2 || argc > 3 || !fgets(line, sizeof(line), stdin))
		return 2;
	depth = atoi(argv[1]);
	const char *mode = argc == 3 ? argv[2] : "plain";
	syscalls_too = strcmp(mode, "syscalls") == 0;
	/* The thread starts with SIGALRM blocked (it inherits the mask), so that the signal test's
	 * handler always interrupts the main thread's loop, never a thread still starting. */
	sigset_t alarm;
	sigemptyset(&alarm);
	sigaddset(&alarm, SIGALRM);
	pthread_sigmask(SIG_BLOCK, &alarm, NULL);
	pthread_t thread;
	pthread_create(&thread, NULL, worker, NULL);
	pthread_sigmask(SIG_UNBLOCK, &alarm, NULL);
	if (strcmp(mode, "signal") == 0) {
		struct sigaction sa = { .sa_handler = on_alarm, .sa_flags = SA_RESTART };
		sigaction(SIGALRM, &sa, NULL);
		struct itimerval timer = { .it_interval = { 0, 1000 }, .it_value = { 0, 1000 } };
		setitimer(ITIMER_REAL, &timer, NULL);
	}
	sink = recurse(depth);
	return 0;
}

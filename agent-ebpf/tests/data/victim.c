/* A victim for the BPF unwinder's tests, built with gcc -O2 -fomit-frame-pointer: main and one
 * thread recurse DEPTH calls deep, then sort through libc's qsort forever with a comparator that
 * calls burn(), where the point check's uprobe sits. It waits for a line on stdin before it
 * starts, so that the test can load its tables and attach first.
 *
 * Modes: "plain"; "syscalls" (the loop also makes system calls through the PLT, so that
 * cpu-clock samples land in the kernel and in PLT stubs); "signal" (a SIGALRM handler, every
 * millisecond, calls handler_work() on the main thread, where a uprobe sees the stack through the
 * signal frame); "flat" (instead of recursing, a chain of 112 distinct functions, chain111 down
 * to chain0, leads to the loop: a deep stack whose return addresses are all different).
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

/* The flat mode's chain: each function calls the next and stores after the call (no tail call). */
#define CHAIN(n, next)                                          \
	__attribute__((noipa)) uint64_t n(void)                    \
	{                                                          \
		uint64_t r = next();                               \
		sink = r;                                          \
		return r + 1;                                      \
	}

__attribute__((noipa)) uint64_t chain_end(void)
{
	return recurse(0);
}

CHAIN(chain0, chain_end)
CHAIN(chain1, chain0)
CHAIN(chain2, chain1)
CHAIN(chain3, chain2)
CHAIN(chain4, chain3)
CHAIN(chain5, chain4)
CHAIN(chain6, chain5)
CHAIN(chain7, chain6)
CHAIN(chain8, chain7)
CHAIN(chain9, chain8)
CHAIN(chain10, chain9)
CHAIN(chain11, chain10)
CHAIN(chain12, chain11)
CHAIN(chain13, chain12)
CHAIN(chain14, chain13)
CHAIN(chain15, chain14)
CHAIN(chain16, chain15)
CHAIN(chain17, chain16)
CHAIN(chain18, chain17)
CHAIN(chain19, chain18)
CHAIN(chain20, chain19)
CHAIN(chain21, chain20)
CHAIN(chain22, chain21)
CHAIN(chain23, chain22)
CHAIN(chain24, chain23)
CHAIN(chain25, chain24)
CHAIN(chain26, chain25)
CHAIN(chain27, chain26)
CHAIN(chain28, chain27)
CHAIN(chain29, chain28)
CHAIN(chain30, chain29)
CHAIN(chain31, chain30)
CHAIN(chain32, chain31)
CHAIN(chain33, chain32)
CHAIN(chain34, chain33)
CHAIN(chain35, chain34)
CHAIN(chain36, chain35)
CHAIN(chain37, chain36)
CHAIN(chain38, chain37)
CHAIN(chain39, chain38)
CHAIN(chain40, chain39)
CHAIN(chain41, chain40)
CHAIN(chain42, chain41)
CHAIN(chain43, chain42)
CHAIN(chain44, chain43)
CHAIN(chain45, chain44)
CHAIN(chain46, chain45)
CHAIN(chain47, chain46)
CHAIN(chain48, chain47)
CHAIN(chain49, chain48)
CHAIN(chain50, chain49)
CHAIN(chain51, chain50)
CHAIN(chain52, chain51)
CHAIN(chain53, chain52)
CHAIN(chain54, chain53)
CHAIN(chain55, chain54)
CHAIN(chain56, chain55)
CHAIN(chain57, chain56)
CHAIN(chain58, chain57)
CHAIN(chain59, chain58)
CHAIN(chain60, chain59)
CHAIN(chain61, chain60)
CHAIN(chain62, chain61)
CHAIN(chain63, chain62)
CHAIN(chain64, chain63)
CHAIN(chain65, chain64)
CHAIN(chain66, chain65)
CHAIN(chain67, chain66)
CHAIN(chain68, chain67)
CHAIN(chain69, chain68)
CHAIN(chain70, chain69)
CHAIN(chain71, chain70)
CHAIN(chain72, chain71)
CHAIN(chain73, chain72)
CHAIN(chain74, chain73)
CHAIN(chain75, chain74)
CHAIN(chain76, chain75)
CHAIN(chain77, chain76)
CHAIN(chain78, chain77)
CHAIN(chain79, chain78)
CHAIN(chain80, chain79)
CHAIN(chain81, chain80)
CHAIN(chain82, chain81)
CHAIN(chain83, chain82)
CHAIN(chain84, chain83)
CHAIN(chain85, chain84)
CHAIN(chain86, chain85)
CHAIN(chain87, chain86)
CHAIN(chain88, chain87)
CHAIN(chain89, chain88)
CHAIN(chain90, chain89)
CHAIN(chain91, chain90)
CHAIN(chain92, chain91)
CHAIN(chain93, chain92)
CHAIN(chain94, chain93)
CHAIN(chain95, chain94)
CHAIN(chain96, chain95)
CHAIN(chain97, chain96)
CHAIN(chain98, chain97)
CHAIN(chain99, chain98)
CHAIN(chain100, chain99)
CHAIN(chain101, chain100)
CHAIN(chain102, chain101)
CHAIN(chain103, chain102)
CHAIN(chain104, chain103)
CHAIN(chain105, chain104)
CHAIN(chain106, chain105)
CHAIN(chain107, chain106)
CHAIN(chain108, chain107)
CHAIN(chain109, chain108)
CHAIN(chain110, chain109)
CHAIN(chain111, chain110)

static int flat;

/* The stack the mode asks for, then the loop. */
static uint64_t run(void)
{
	return flat ? chain111() : recurse(depth);
}

static void *worker(void *arg)
{
	(void)arg;
	sink = run();
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
	flat = strcmp(mode, "flat") == 0;
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
	sink = run();
	return 0;
}

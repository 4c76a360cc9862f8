/* The workloads of the agent's whole-stack tests (agent/tests/agent/unwind.rs), built with
 * gcc -O2 -fomit-frame-pointer: nothing here keeps a frame pointer, like Debian's packages.
 *
 * Usage: workload MODE DEPTH [LIBRARY]
 *   qsort   main and two threads recurse DEPTH calls deep, then sort forever through libc's qsort
 *           with a comparator that spins in burn()
 *   signal  as qsort on the main thread, with a SIGALRM handler every millisecond that spins
 *   plt     main calls strlen and memchr through the PLT in a tight loop
 *   dlopen  main spins for 3 s, then prints "dlopen <Unix ms>", dlopen()s LIBRARY and spins
 *           inside it forever
 *   vdso    main calls clock_gettime and gettimeofday in a tight loop: the time is read in the
 *           vDSO, without a system call
 * It runs until killed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static int depth;
volatile uint64_t sink;
volatile const char *text = "a string of some length for strlen and memchr to go through";

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

__attribute__((noipa)) uint64_t recurse(int d)
{
	if (d == 0) {
		uint64_t total = 0;
		for (;;)
			total += sort_it();
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

__attribute__((noipa)) void handler_work(void)
{
	for (int i = 0; i < 200; i++)
		burn((uint64_t)i);
}

__attribute__((noipa)) void on_alarm(int sig)
{
	(void)sig;
	handler_work();
	sink += 1; /* not a tail call: the handler keeps its frame */
}

__attribute__((noipa)) uint64_t plt_loop(void)
{
	uint64_t total = 0;
	for (;;) {
		total += strlen((const char *)text);
		total += (uint64_t)(uintptr_t)memchr((const void *)text, 'z', 60);
		sink = total;
	}
	return total;
}

__attribute__((noipa)) uint64_t clock_loop(void)
{
	uint64_t total = 0;
	for (;;) {
		struct timespec now;
		struct timeval tv;
		clock_gettime(CLOCK_MONOTONIC, &now);
		gettimeofday(&tv, NULL);
		total += (uint64_t)now.tv_nsec + (uint64_t)tv.tv_usec;
		sink = total;
	}
	return total;
}

__attribute__((noipa)) void spin_for(double seconds)
{
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	do {
		burn(1);
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
}

__attribute__((noipa)) void call_library(const char *path)
{
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	printf("dlopen %lld\n", (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000);
	fflush(stdout);
	void *library = dlopen(path, RTLD_NOW);
	if (!library) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		exit(2);
	}
	void (*outer)(int) = (void (*)(int))dlsym(library, "library_outer");
	outer(4);
	sink += 1;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	const char *mode = argv[1];
	depth = atoi(argv[2]);
	if (strcmp(mode, "plt") == 0) {
		sink = plt_loop();
		return 0;
	}
	if (strcmp(mode, "vdso") == 0) {
		sink = clock_loop();
		return 0;
	}
	if (strcmp(mode, "dlopen") == 0) {
		if (argc < 4)
			return 2;
		spin_for(3.0);
		call_library(argv[3]);
		return 0;
	}
	/* The threads start with SIGALRM blocked (they inherit the mask): the handler interrupts
	 * the main thread only. */
	sigset_t alarm;
	sigemptyset(&alarm);
	sigaddset(&alarm, SIGALRM);
	pthread_sigmask(SIG_BLOCK, &alarm, NULL);
	pthread_t threads[2];
	if (strcmp(mode, "signal") != 0)
		for (int i = 0; i < 2; i++)
			pthread_create(&threads[i], NULL, worker, NULL);
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

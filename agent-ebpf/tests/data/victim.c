/* A victim for the BPF unwinder's tests, built with gcc -O2 -fomit-frame-pointer: main and one
 * thread recurse DEPTH calls deep, then sort through libc's qsort forever with a comparator that
 * calls burn(), where the point check's uprobe sits. It waits for a line on stdin before it
 * starts, so that the test can load its tables and attach first.
 *
 * Usage: victim DEPTH
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int depth;
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

int main(int argc, char **argv)
{
	char line[16];
	if (argc != 2 || !fgets(line, sizeof(line), stdin))
		return 2;
	depth = atoi(argv[1]);
	pthread_t thread;
	pthread_create(&thread, NULL, worker, NULL);
	sink = recurse(depth);
	return 0;
}

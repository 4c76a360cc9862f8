/* The off-CPU and memory-growth workloads (agent/tests/agent/offcpu.rs), built with gcc -O2
 * -fomit-frame-pointer. Each waits for a line on stdin, runs its mode, prints
 * "done <start ms> <end ms> <measured> <extra>" (wall clock; what it measured itself: blocked
 * nanoseconds, or bytes touched; extra: AnonHugePages kB), then waits for stdin to close. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static long long clock_ns(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
static long long wall_ms(void) { return clock_ns(CLOCK_REALTIME) / 1000000; }
static void gate(void) {
    char line[64];
    if (!fgets(line, sizeof line, stdin)) exit(0);
}
__attribute__((noinline)) void nap(long ns) {
    struct timespec t = {ns / 1000000000L, ns % 1000000000L};
    nanosleep(&t, 0);
}
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int stop;
static volatile unsigned long sink;
__attribute__((noinline)) void hold_lock(void) {
    pthread_mutex_lock(&lock);
    long long end = clock_ns(CLOCK_MONOTONIC) + 10000000;
    while (clock_ns(CLOCK_MONOTONIC) < end) sink++;
    pthread_mutex_unlock(&lock);
}
__attribute__((noinline)) void lock_site(void) {
    pthread_mutex_lock(&lock);
    pthread_mutex_unlock(&lock);
}
static void *holder(void *arg) {
    (void)arg;
    while (!stop) { hold_lock(); nap(1000000); }
    return 0;
}
__attribute__((noinline)) int wait_for_events(int fd, int ms) {
    struct epoll_event ev;
    return epoll_wait(fd, &ev, 1, ms);
}
__attribute__((noinline)) void touch_memory(char *p, long bytes) {
    for (long i = 0; i < bytes; i += 4096) p[i] = 1;
}
__attribute__((noinline)) void touch_huge(char *p, long bytes) {
    for (long i = 0; i < bytes; i += 4096) p[i] = 1;
}
static long anon_huge_kb(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}
int main(int argc, char **argv) {
    const char *mode = argv[1];
    long a = argc > 2 ? atol(argv[2]) : 0, b = argc > 3 ? atol(argv[3]) : 0;
    gate();
    long long start = wall_ms(), measured = 0, extra = 0;
    if (!strcmp(mode, "sleep")) {
        for (long i = 0; i < a; i++) {
            long long t0 = clock_ns(CLOCK_MONOTONIC);
            nap(b * 1000000L);
            measured += clock_ns(CLOCK_MONOTONIC) - t0;
        }
    } else if (!strcmp(mode, "mutex")) {
        pthread_t t;
        pthread_create(&t, 0, holder, 0);
        long long end = clock_ns(CLOCK_MONOTONIC) + a * 1000000000LL;
        while (clock_ns(CLOCK_MONOTONIC) < end) { lock_site(); nap(2000000); }
        stop = 1;
        pthread_join(t, 0);
    } else if (!strcmp(mode, "epoll")) {
        int fd = epoll_create1(0);
        long long t0 = clock_ns(CLOCK_MONOTONIC);
        wait_for_events(fd, (int)(a * 1000));
        measured = clock_ns(CLOCK_MONOTONIC) - t0;
    } else if (!strcmp(mode, "touch") || !strcmp(mode, "huge")) {
        long bytes = a << 20, align = 2L << 20;
        char *raw = mmap(0, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        char *p = (char *)(((unsigned long)raw + align - 1) & ~(align - 1));
        int huge = !strcmp(mode, "huge");
        madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
        /* 2 MiB at a time, 10 ms apart: at one sample per fault, the agent keeps up. */
        for (long off = 0; off < bytes; off += align) {
            if (huge)
                touch_huge(p + off, align);
            else
                touch_memory(p + off, align);
            nap(10000000L);
        }
        measured = bytes;
        extra = anon_huge_kb();
    }
    printf("done %lld %lld %lld %lld\n", start, wall_ms(), measured, extra);
    fflush(stdout);
    gate();
    return 0;
}

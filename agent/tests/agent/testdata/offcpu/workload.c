/* The off-CPU and memory-growth workloads (agent/tests/agent/offcpu.rs), built with gcc -O2
 * -fomit-frame-pointer. Each waits for a line on stdin, runs its mode, prints
 * "done <start ms> <end ms> <measured> <extra>" (wall clock; what it measured itself: blocked
 * nanoseconds, nanoseconds waited on a run queue, or the bytes its page faults mapped; extra:
 * how many of those faults mapped a transparent huge page), then waits for stdin to close. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
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
/* Sleeps of `arg` milliseconds until the process is killed (not measured, not under nap). */
__attribute__((noinline)) void *linger(void *arg) {
    struct timespec t = {0, (long)arg * 1000000L};
    for (;;) nanosleep(&t, 0);
    return 0;
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
/* Nanoseconds the calling thread has waited on a run queue (/proc's schedstat, second field). */
static long long run_delay(void) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", (int)gettid());
    FILE *f = fopen(path, "r");
    long long on_cpu = 0, delay = 0;
    if (f) {
        if (fscanf(f, "%lld %lld", &on_cpu, &delay) != 2) delay = 0;
        fclose(f);
    }
    return delay;
}
static long long hog_end;
static int hog_cpu;
static long long hog_delays[2];
__attribute__((noinline)) void hog(void) {
    while (clock_ns(CLOCK_MONOTONIC) < hog_end) sink++;
}
static void *hogger(void *arg) {
    long i = (long)arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(hog_cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
    long long before = run_delay();
    hog();
    hog_delays[i] = run_delay() - before;
    return 0;
}
static long minor_faults(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_minflt;
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
    } else if (!strcmp(mode, "hog")) {
        /* Two threads spinning for a seconds on one CPU (the last): each waits on the run queue
         * while the other runs. The truth: their run delays over the spin. */
        hog_cpu = (int)sysconf(_SC_NPROCESSORS_ONLN) - 1;
        hog_end = clock_ns(CLOCK_MONOTONIC) + a * 1000000000LL;
        pthread_t t[2];
        for (long i = 0; i < 2; i++) pthread_create(&t[i], 0, hogger, (void *)i);
        for (long i = 0; i < 2; i++) pthread_join(t[i], 0);
        measured = hog_delays[0] + hog_delays[1];
    } else if (!strcmp(mode, "touch") || !strcmp(mode, "huge") || !strcmp(mode, "fallback")) {
        /* touch: base pages (MADV_NOHUGEPAGE). huge: MADV_HUGEPAGE, huge pages where the kernel
         * has them to give. fallback: MADV_HUGEPAGE memory whose every 2 MiB block already has
         * a page (touched while the range refused huge pages), so that its faults map base
         * pages into blocks that allow huge ones: the page table of a fault the kernel could
         * not give a huge page. The truth: the process's minor faults (one base page each),
         * those that mapped a huge page counting 2 MiB: in huge mode, one per block over
         * whose touch AnonHugePages grew by 2 MiB; in fallback mode none (a block khugepaged
         * collapses meanwhile grows AnonHugePages, but no fault of the process mapped it). */
        long bytes = a << 20, align = 2L << 20;
        char *raw = mmap(0, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        char *p = (char *)(((unsigned long)raw + align - 1) & ~(align - 1));
        int huge = strcmp(mode, "touch") != 0, watch = !strcmp(mode, "huge");
        madvise(p, bytes, MADV_NOHUGEPAGE);
        if (!strcmp(mode, "fallback"))
            for (long off = 0; off < bytes; off += align) p[off] = 1;
        if (huge) madvise(p, bytes, MADV_HUGEPAGE);
        /* b: milliseconds to wait first, so that workloads run one after another. */
        nap(b * 1000000L);
        long faults = minor_faults(), huge_faults = 0, huge_kb = anon_huge_kb();
        /* 2 MiB at a time, 10 ms apart: at one sample per fault, the agent keeps up. */
        for (long off = 0; off < bytes; off += align) {
            if (huge)
                touch_huge(p + off, align);
            else
                touch_memory(p + off, align);
            if (watch) {
                long kb = anon_huge_kb();
                huge_faults += kb - huge_kb >= 2048;
                huge_kb = kb;
            }
            nap(10000000L);
        }
        faults = minor_faults() - faults;
        measured = (faults - huge_faults) * 4096 + huge_faults * align;
        extra = huge_faults;
    }
    printf("done %lld %lld %lld %lld\n", start, wall_ms(), measured, extra);
    fflush(stdout);
    if (argc > 4 && !strcmp(argv[4], "linger")) {
        pthread_t t;
        pthread_create(&t, 0, linger, (void *)b);
    }
    gate();
    return 0;
}

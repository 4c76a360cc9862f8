/* Page-fault-heavy workload: touches `mib` MiB of fresh anonymous memory page by page (base
 * pages), `rounds` times, and prints the milliseconds it took. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
int main(int argc, char **argv) {
    long bytes = atol(argv[1]) << 20; int rounds = atoi(argv[2]);
    double t0 = now();
    for (int r = 0; r < rounds; r++) {
        char *p = mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        madvise(p, bytes, MADV_NOHUGEPAGE);
        for (long i = 0; i < bytes; i += 4096) p[i] = 1;
        munmap(p, bytes);
    }
    printf("%.1f\n", now() - t0);
    return 0;
}

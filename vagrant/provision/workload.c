/* The demo workload: a CPU-bound program whose flame graph is known in advance.
 * `main` calls `slow_function` for four fifths of its time and `fast_function` for one fifth.
 * Built with frame pointers so that the agent's stacks reach `main` through `slow_function`,
 * and without sibling-call optimisation so that `slow_function` and `fast_function` keep their
 * frames (at -O1 they would jump to `spin` instead of calling it).
 * Usage: smolder-demo [percent of one core, default 100]; below 100 it sleeps between rounds
 * (sleeping is not sampled, so the flame graph keeps its shape). */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static volatile uint64_t sink;

/* -O0 here: GCC 12 leaves a frame pointer out of an optimised leaf that needs no stack, even with
 * -fno-omit-frame-pointer, and the unwinder would then skip its caller. */
__attribute__((noinline, optimize("O0"))) static void spin(uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        sink += i * 2654435761u;
}

__attribute__((noinline)) void slow_function(void) { spin(400000); }
__attribute__((noinline)) void fast_function(void) { spin(100000); }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double percent = argc > 1 ? atof(argv[1]) : 100;
    if (percent <= 0 || percent > 100)
        percent = 100;
    for (;;) {
        double start = now();
        slow_function();
        fast_function();
        if (percent < 100) {
            double idle = (now() - start) * (100 - percent) / percent;
            struct timespec pause = {(time_t)idle, (long)((idle - (time_t)idle) * 1e9)};
            nanosleep(&pause, NULL);
        }
    }
}

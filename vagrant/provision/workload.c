/* The demo workload: a CPU-bound program whose flame graph is known in advance.
 * `main` calls `slow_function` for four fifths of its time and `fast_function` for one fifth.
 * Built with frame pointers so that the agent's stacks reach `main`. */
#include <stdint.h>

static volatile uint64_t sink;

__attribute__((noinline)) static void spin(uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        sink += i * 2654435761u;
}

__attribute__((noinline)) void slow_function(void) { spin(400000); }
__attribute__((noinline)) void fast_function(void) { spin(100000); }

int main(void) {
    for (;;) {
        slow_function();
        fast_function();
    }
}

/* The library the dlopen workload loads after start (agent/tests/agent/unwind.rs), built with
 * gcc -O2 -fomit-frame-pointer -shared -fPIC. */
#include <stdint.h>

volatile uint64_t library_sink;

__attribute__((noipa)) void library_inner(void)
{
	uint64_t x = library_sink;
	for (;;) {
		for (int i = 0; i < 1000; i++)
			x = x * 6364136223846793005ULL + 1442695040888963407ULL;
		library_sink = x;
	}
}

__attribute__((noipa)) void library_outer(int d)
{
	if (d == 0)
		library_inner();
	else
		library_outer(d - 1);
	library_sink += 1;
}

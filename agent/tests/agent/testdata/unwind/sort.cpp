// The C++ workload of the agent's whole-stack tests (agent/tests/agent/unwind.rs), built with
// g++ -O2 -fomit-frame-pointer: std::sort over a vector, forever, with a comparator that spins.
#include <algorithm>
#include <cstdint>
#include <vector>

volatile std::uint64_t sink;

__attribute__((noipa)) bool slow_less(std::uint64_t a, std::uint64_t b)
{
	std::uint64_t x = a ^ b;
	for (int i = 0; i < 300; i++)
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
	sink = x;
	return a < b;
}

__attribute__((noipa)) void sort_forever()
{
	for (;;) {
		std::vector<std::uint64_t> values(4096);
		for (std::size_t i = 0; i < values.size(); i++)
			values[i] = (i * 7919) % values.size();
		std::sort(values.begin(), values.end(), slow_less);
		sink = values[0];
	}
}

int main()
{
	sort_forever();
	return 0;
}

// The Go workload of the agent's whole-stack tests (agent/tests/agent/unwind.rs): main.main
// recurses DEPTH calls deep (the first argument), then spins in burn until killed. Go keeps
// frame pointers; its binaries have no .eh_frame for Go code.
package main

import (
	"os"
	"strconv"
)

var sink uint64

//go:noinline
func burn(x uint64) uint64 {
	for i := 0; i < 300; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

//go:noinline
func recurse(d int) uint64 {
	if d == 0 {
		var total uint64
		for {
			total += burn(total)
			sink = total
		}
	}
	r := recurse(d - 1)
	sink = r
	return r + uint64(d)
}

func main() {
	depth, err := strconv.Atoi(os.Args[1])
	if err != nil {
		os.Exit(2)
	}
	sink = recurse(depth)
}

// A pprof target for the scrape tests: net/http/pprof on the address given as the first
// argument (port 0: a free one, said on stderr as `listening <address>`), CPU burnt in burnCPU, memory retained by retainMemory, allocations made on demand by
// allocateMemory (GET /alloc?mib=N), and lock contention in contend. The CPU burner's samples
// carry the pprof label worker=burner.
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"time"
)

var (
	retained [][]byte
	sink     []byte
	mu       sync.Mutex
	counter  int
)

//go:noinline
func burnCPU() {
	x := 1.0
	for {
		for i := 0; i < 1000000; i++ {
			x = x*1.0000001 + 0.5
		}
		if x < 0 {
			fmt.Println(x)
		}
	}
}

//go:noinline
func retainMemory(mib int) {
	for i := 0; i < mib; i++ {
		retained = append(retained, make([]byte, 1<<20))
	}
}

//go:noinline
func allocateMemory(mib int) {
	for i := 0; i < mib; i++ {
		sink = make([]byte, 1<<20)
	}
}

//go:noinline
func contend() {
	for {
		mu.Lock()
		counter++
		time.Sleep(time.Millisecond)
		mu.Unlock()
	}
}

func main() {
	// Every allocation is recorded, so allocation profiles are exact, not estimates.
	runtime.MemProfileRate = 1
	runtime.SetMutexProfileFraction(1)
	runtime.SetBlockProfileRate(1)
	retainMemory(4)
	// The CPU samples carry a pprof label, which becomes a series label.
	go pprof.Do(context.Background(), pprof.Labels("worker", "burner"), func(context.Context) { burnCPU() })
	go contend()
	go contend()
	http.HandleFunc("/alloc", func(w http.ResponseWriter, r *http.Request) {
		mib, err := strconv.Atoi(r.URL.Query().Get("mib"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		allocateMemory(mib)
		// The heap profile is published at the end of a GC cycle; two make it current.
		runtime.GC()
		runtime.GC()
		fmt.Fprintln(w, "ok")
	})
	// Port 0 takes a free port: the line on stderr says which, for the test to read.
	listener, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "listening %s\n", listener.Addr())
	if err := http.Serve(listener, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

#!/bin/bash
# agent/benches/offcpu/bench.sh: as root, after cargo build --release -p smolder-agent; writes its configs and the fault workload to a temporary directory.
# Interleaved rounds: no agent, the kernel's own count of minor faults (`perf stat`, no BPF: the floor of any
# page-fault profiler), CPU only, off-CPU 0.01 (defaults), off-CPU 0.01 and 1.0 uncapped, memory growth (period 1024);
# each round rotates the order. Prints: config round pingpong_2cpu_us pingpong_1cpu_us fault_ms
# (ping-pong: `perf bench sched pipe -T`, µs per round trip; on 2 CPUs it is mostly wake-up latency, pinned to one
# CPU it is two context switches, so the hook's per-switch cost shows). Under each: one ping-pong on both CPUs, the
# median of two pinned ones and of three fault runs.
A=${A:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release/smolder-agent}
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cd "$work"; gcc -O2 -o fault "$src/fault.c"
base='window:\n  length: 10s\nebpf:\n  unwind:\n    load-at-start: false\n'
printf "$base" > cpu.yaml
printf "$base  off-cpu:\n    enabled: true\n    probability: 0.01\n" > oc001.yaml
printf "$base  off-cpu:\n    enabled: true\n    probability: 0.01\n    max-unwinds-per-second: 0\n" > oc001nocap.yaml
printf "$base  off-cpu:\n    enabled: true\n    probability: 1.0\n    max-unwinds-per-second: 0\n" > oc1.yaml
printf "$base  memory:\n    enabled: true\n" > mem.yaml
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
configs=(none faultcount cpu oc001 oc001nocap oc1 mem)
n=${#configs[@]}
for round in $(seq 1 ${ROUNDS:-5}); do
  for i in $(seq 0 $((n - 1))); do
    c=${configs[$(( (i + round) % n ))]}
    case $c in
      none) sleep 2 ;;
      faultcount) perf stat -a -e minor-faults -o /dev/null -- sleep 30 & bg=$!; sleep 1 ;;
      *) d=$(mktemp -d)
         $A --config $c.yaml --data-dir $d --log-level error record --duration 30s > /dev/null & bg=$!
         sleep 4 ;;
    esac
    pp=$(perf bench sched pipe -T -l 100000 2>/dev/null | awk '/usecs\/op/ {print $1}')
    pp1=$(for k in 1 2; do taskset -c 1 perf bench sched pipe -T -l 200000 2>/dev/null | awk '/usecs\/op/ {print $1}'; done | median)
    f=$(for k in 1 2 3; do ./fault 256 2; done | median)
    if [ $c != none ]; then kill $bg; wait $bg 2>/dev/null; fi
    if [ -n "${d:-}" ]; then rm -rf $d; d=; fi
    echo "$c $round $pp $pp1 $f"
  done
done

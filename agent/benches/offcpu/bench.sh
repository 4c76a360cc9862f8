#!/bin/bash
# agent/benches/offcpu/bench.sh: as root, after cargo build --release -p smolder-agent; writes its configs and the fault workload to a temporary directory.
# Interleaved rounds: no agent, CPU only, off-CPU 0.01, off-CPU 1.0, memory growth (period 1024);
# each round rotates the order. Prints: config round usecs_per_pingpong fault_ms
A=${A:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release/smolder-agent}
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cd "$work"; gcc -O2 -o fault "$src/fault.c"
base='window:\n  length: 10s\nebpf:\n  unwind:\n    load-at-start: false\n'
printf "$base" > cpu.yaml
printf "$base  off-cpu:\n    enabled: true\n    probability: 0.01\n    max-unwinds-per-second: 0\n" > oc001.yaml
printf "$base  off-cpu:\n    enabled: true\n    probability: 1.0\n    max-unwinds-per-second: 0\n" > oc1.yaml
printf "$base  memory:\n    enabled: true\n" > mem.yaml
configs=(none cpu oc001 oc1 mem)
for round in $(seq 1 ${ROUNDS:-5}); do
  for i in 0 1 2 3 4; do
    c=${configs[$(( (i + round) % 5 ))]}
    if [ $c != none ]; then
      d=$(mktemp -d)
      $A --config $c.yaml --data-dir $d --log-level error record --duration 9s > /dev/null &
      agent=$!
      sleep 4
    fi
    pp=$(perf bench sched pipe -T -l 100000 2>/dev/null | awk '/usecs\/op/ {print $1}')
    f=$(./fault 256 2)
    if [ $c != none ]; then wait $agent; rm -rf $d; fi
    echo "$c $round $pp $f"
  done
done

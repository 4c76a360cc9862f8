#!/usr/bin/env bash
# Builds and starts the demo workload (workload.c) as `smolder-demo`, in the background: under
# systemd as a transient unit (so the agent names it by its unit), else as a plain process.
# Usage: workload.sh [percent of one core, default 100; the multi-host test uses less]
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

apt_install gcc libc6-dev
mkdir -p "$STATE/smolder-demo"
percent=${1:-100}
gcc -O1 -fno-omit-frame-pointer -fno-optimize-sibling-calls -o "$STATE/smolder-demo/smolder-demo" "$here/workload.c"
if has_systemd; then
    systemctl stop smolder-demo 2>/dev/null || true
    systemd-run --quiet --unit smolder-demo --property=Restart=always \
        "$STATE/smolder-demo/smolder-demo" "$percent"
else
    start_daemon smolder-demo "$STATE/smolder-demo/smolder-demo" "$percent"
fi

#!/usr/bin/env bash
# Provisions an agent host: installs the package, writes its config (its name, the aggregator's
# address, the fleet CA, its own token, the demo's metrics-export rules) and starts it.
# Run credentials.sh first.
# Usage: agent.sh <agent-name> <aggregator-ip>
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

name=$1
aggregator_ip=$2
share="${SMOLDER_SHARE:-/vagrant/.smolder}"
apt_install curl
install_package smolder-agent
mkdir -p "$ETC/tls" "$STATE/smolder-agent"
install -m 0644 "$share/ca.pem" "$ETC/tls/"

cat >"$ETC/agent.yaml" <<YAML
# Written by vagrant/provision/agent.sh.
hostname: $name
http:
  # Prometheus on another host scrapes /metrics and /exported-metrics.
  listen: 0.0.0.0:4042
ship:
  aggregator: $aggregator_ip:4041
  server-name: aggregator
  ca: $ETC/tls/ca.pem
  token: $(cat "$share/token-$name")
metrics-export-rules:
  smolder_demo_slow_function_cpu_seconds_total:
    expr: smolder-demo.cpu
    node: slow_function
    group_by: [hostname]
YAML
if [ -n "$HOST_ROOT" ]; then
    # A simulated host of the multi-host test shares the machine's processes with the other
    # hosts: profile only the programs under its own root (its workload).
    cat >>"$ETC/agent.yaml" <<YAML
ebpf:
  relabel-configs:
    - source_labels: [__meta_process_exe]
      regex: "$HOST_ROOT/.*"
      action: keep
YAML
fi
chmod 0640 "$ETC/agent.yaml"
if has_systemd; then
    chown root:smolder-agent "$ETC/agent.yaml"
fi

start_daemon smolder-agent /usr/bin/smolder-agent --config "$ETC/agent.yaml" \
    --data-dir "$STATE/smolder-agent" --log-format json
wait_http http://127.0.0.1:4042/healthz

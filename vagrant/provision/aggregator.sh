#!/usr/bin/env bash
# Provisions the aggregator host: installs the package, writes its config (the fleet CA's
# certificate for QUIC; credentials: one token per agent, Prometheus', an admin's; the demo's
# metrics-export rules) and starts it. With SMOLDER_OBJECT_STORE naming the file garage.sh
# wrote, it keeps its blocks in that bucket (object-storage mode) rather than on its disk.
# Run credentials.sh first (and garage.sh, for a bucket).
# Usage: [SMOLDER_OBJECT_STORE=<file>] aggregator.sh <agent-name>...
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

share="${SMOLDER_SHARE:-/vagrant/.smolder}"
apt_install curl
install_package smolder-aggregator
mkdir -p "$ETC/tls" "$STATE/smolder-aggregator"
install -m 0644 "$share/ca.pem" "$share/aggregator.pem" "$ETC/tls/"
install -m 0640 "$share/aggregator.key" "$ETC/tls/"

store=""
if [ -n "${SMOLDER_OBJECT_STORE:-}" ]; then
    store="store:"$'\n'"$(cat "$SMOLDER_OBJECT_STORE")"
fi
credentials=""
for agent in "$@"; do
    credentials="$credentials    - {name: $agent, token: $(cat "$share/token-$agent"), scopes: [ingest]}"$'\n'
done
cat >"$ETC/aggregator.yaml" <<YAML
# Written by vagrant/provision/aggregator.sh.
http:
  listen: 0.0.0.0:4040
auth:
  credentials:
    - {name: admin, token: $(cat "$share/token-admin"), scopes: [admin]}
    - {name: prometheus, token: $(cat "$share/token-prometheus"), scopes: [read]}
$credentials  # Prometheus presents its token for /metrics too.
  open-metrics: false
ingest:
  quic:
    listen: 0.0.0.0:4041
    cert: $ETC/tls/aggregator.pem
    key: $ETC/tls/aggregator.key
metrics-export-rules:
  smolder_demo_cpu_seconds_total:
    expr: smolder-demo.cpu
    group_by: [hostname]
  smolder_demo_slow_function_cpu_seconds_total:
    expr: smolder-demo.cpu
    node: slow_function
    group_by: [hostname]
$store
YAML
chmod 0640 "$ETC/aggregator.yaml"
if has_systemd; then
    chown root:smolder-aggregator "$ETC/aggregator.yaml" "$ETC/tls/aggregator.key"
fi

start_daemon smolder-aggregator /usr/bin/smolder-aggregator --config "$ETC/aggregator.yaml" \
    --data-dir "$STATE/smolder-aggregator" --log-format json
wait_http http://127.0.0.1:4040/healthz

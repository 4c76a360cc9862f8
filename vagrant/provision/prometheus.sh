#!/usr/bin/env bash
# Provisions the Prometheus host: Debian's prometheus, scraping the aggregator (with its read
# token, made by credentials.sh) and every agent (/metrics and /exported-metrics), with
# Smolder's own recording rules and alerts loaded.
# Usage: prometheus.sh <aggregator-ip> <agent-ip>...
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

aggregator_ip=$1
shift
share="${SMOLDER_SHARE:-/vagrant/.smolder}"
apt_install prometheus curl
etc="$HOST_ROOT/etc/prometheus"
mkdir -p "$etc" "$STATE/prometheus"
install -m 0644 "$here/../../monitoring/prometheus/smolder-rules.yml" "$etc/smolder-rules.yml"
# Readable by the prometheus user only (under systemd); the aggregator's credential for it.
install -m 0640 "$share/token-prometheus" "$etc/smolder-token"
if has_systemd; then
    chown root:prometheus "$etc/smolder-token"
fi

agents=""
for ip in "$@"; do
    agents="$agents'$ip:4042', "
done
cat >"$etc/prometheus.yml" <<YAML
# Written by vagrant/provision/prometheus.sh.
global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files:
  - $etc/smolder-rules.yml
scrape_configs:
  - job_name: smolder-aggregator
    authorization:
      credentials_file: $etc/smolder-token
    static_configs:
      - targets: ['$aggregator_ip:4040']
  - job_name: smolder-aggregator-exported
    metrics_path: /exported-metrics
    authorization:
      credentials_file: $etc/smolder-token
    static_configs:
      - targets: ['$aggregator_ip:4040']
  - job_name: smolder-agent
    static_configs:
      - targets: [$agents]
  - job_name: smolder-agent-exported
    metrics_path: /exported-metrics
    static_configs:
      - targets: [$agents]
YAML

if has_systemd; then
    install -m 0644 "$etc/prometheus.yml" /etc/prometheus/prometheus.yml
    systemctl enable --now prometheus >/dev/null
    systemctl restart prometheus
else
    start_daemon prometheus /usr/bin/prometheus --config.file "$etc/prometheus.yml" \
        --storage.tsdb.path "$STATE/prometheus" --web.listen-address 0.0.0.0:9090
fi
wait_http http://127.0.0.1:9090/-/ready

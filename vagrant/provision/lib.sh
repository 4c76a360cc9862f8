# Shared by the provisioning scripts. Sourced, not run.
#
# The same scripts provision the Vagrant VMs (systemd, real /etc) and the multi-host test's
# network namespaces (no systemd; every "host" shares this machine's filesystem). For the latter
# the test sets SMOLDER_HOST_ROOT to a per-host directory that stands in for / for the files a
# host owns (config, state, logs), and daemons are started in the background instead of by
# systemd, with the same command lines as the units.
set -euo pipefail

HOST_ROOT="${SMOLDER_HOST_ROOT:-}"
ETC="$HOST_ROOT/etc/smolder"
STATE="$HOST_ROOT/var/lib"
LOGS="$HOST_ROOT/var/log"
RUN="$HOST_ROOT/run"
DEB_DIR="${SMOLDER_DEB_DIR:-/vagrant/target/debian}"

# True when systemd manages this host.
has_systemd() {
    [ -z "$HOST_ROOT" ] && [ -d /run/systemd/system ]
}

# Installs a Smolder package (smolder-aggregator or smolder-agent) from $DEB_DIR.
install_package() {
    local name=$1 deb
    deb=$(ls -t "$DEB_DIR/${name}_"*.deb | head -n 1)
    DEBIAN_FRONTEND=noninteractive dpkg -i "$deb" >/dev/null
}

# Installs Debian packages that are missing.
apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
    fi
}

# Starts a daemon: `systemctl enable --now` under systemd, else in the background with its
# output in $LOGS/<name>.log and its pid in $RUN/<name>.pid.
start_daemon() {
    local name=$1
    shift
    if has_systemd; then
        systemctl enable --now "$name" >/dev/null
        systemctl restart "$name"
        return
    fi
    mkdir -p "$LOGS" "$RUN"
    if [ -f "$RUN/$name.pid" ] && kill -0 "$(cat "$RUN/$name.pid")" 2>/dev/null; then
        kill "$(cat "$RUN/$name.pid")"
        sleep 1
    fi
    setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
    echo $! >"$RUN/$name.pid"
}

# Waits until an HTTP URL answers, for at most 60 s.
wait_http() {
    local url=$1
    for _ in $(seq 1 120); do
        if curl -fsS -o /dev/null "$url" 2>/dev/null; then
            return 0
        fi
        sleep 0.5
    done
    echo "provision: $url did not answer within 60 s" >&2
    return 1
}

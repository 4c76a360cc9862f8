#!/usr/bin/env bash
# Provisions the demo's object store: Garage (a distributed S3 store in Rust) built from
# crates.io at a pinned version, one node with replication factor 1, bucket `smolder` and a key
# that may use it; writes the aggregator's `store.object-store` section, indented for its place
# under `store:`, to $SMOLDER_SHARE/object-store.yaml, which aggregator.sh reads when it is given
# SMOLDER_OBJECT_STORE. Run again, it keeps the node, bucket and key it made.
# Usage: [SMOLDER_GARAGE_BIN=<binary>] garage.sh <address the aggregator reaches this host at>
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

GARAGE_VERSION=2.5.0
address=${1:?usage: garage.sh <address>}
share="${SMOLDER_SHARE:-/vagrant/.smolder}"
config="$ETC/garage.toml"
state="$STATE/garage"
# SMOLDER_GARAGE_BIN: a Garage 2.5.0 binary built elsewhere, which saves the build.
garage_bin=${SMOLDER_GARAGE_BIN:-/usr/local/bin/garage}

# Garage is built from source (its crate ships no binary): a C toolchain for its SQLite and
# zstd, and a current Rust from rustup, since Debian 12's is too old. About 15 minutes on two
# cores, and 2 GiB of memory to link.
# `garage --version` prints "garage cargo:2.5.0 [features: ...]" for a build from crates.io.
if ! "$garage_bin" --version 2>/dev/null | grep -qF "$GARAGE_VERSION"; then
    apt_install ca-certificates curl build-essential pkg-config
    if ! command -v cargo >/dev/null; then
        curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    fi
    PATH="$HOME/.cargo/bin:$PATH" cargo install garage --version "$GARAGE_VERSION" --locked \
        --root /usr/local
fi

mkdir -p "$ETC" "$state/meta" "$state/data" "$share"
# One secret per demo, kept in the shared folder so that a re-provisioned node keeps it.
if [ ! -s "$share/garage-rpc-secret" ]; then
    od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$share/garage-rpc-secret"
fi
cat >"$config" <<TOML
# Written by vagrant/provision/garage.sh.
metadata_dir = "$state/meta"
data_dir = "$state/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "[::]:3901"
rpc_public_addr = "$address:3901"
rpc_secret = "$(cat "$share/garage-rpc-secret")"

[s3_api]
s3_region = "garage"
api_bind_addr = "[::]:3900"
root_domain = ".s3.garage.localhost"
TOML
chmod 0600 "$config"

if has_systemd; then
    cat >/etc/systemd/system/garage.service <<UNIT
[Unit]
Description=Garage, the demo's S3 store (vagrant/provision/garage.sh)
After=network-online.target
Wants=network-online.target

[Service]
ExecStart=$garage_bin -c $config server
Environment=RUST_LOG=garage=warn
Restart=on-failure

[Install]
WantedBy=multi-user.target
UNIT
    systemctl daemon-reload
fi
start_daemon garage "$garage_bin" -c "$config" server

garage() {
    "$garage_bin" -c "$config" "$@"
}
for _ in $(seq 1 120); do
    garage status >/dev/null 2>&1 && break
    sleep 0.5
done
garage status >/dev/null

if [ ! -f "$state/provisioned" ]; then
    node=$(garage node id -q | cut -d@ -f1)
    garage layout assign -z dc1 -c 10G "$node"
    garage layout apply --version 1
    garage bucket create smolder
    garage key create smolder >"$state/key"
    garage bucket allow --read --write --owner smolder --key smolder
    touch "$state/provisioned"
fi
field() {
    sed -n "s/^ *$1: *//p" "$state/key" | head -n 1
}
key_id=$(field "Key ID")
secret=$(field "Secret key")
if [ -z "$key_id" ] || [ -z "$secret" ]; then
    echo "provision: no key id or secret in $state/key (garage key create's output)" >&2
    exit 1
fi

cat >"$share/object-store.yaml" <<YAML
  object-store:
    type: s3
    bucket: smolder
    endpoint: http://$address:3900
    region: garage
    access-key-id: $key_id
    secret-access-key: $secret
YAML
chmod 0640 "$share/object-store.yaml"

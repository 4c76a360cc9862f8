#!/usr/bin/env bash
# Makes the fleet's TLS and credentials once, into $SMOLDER_SHARE (a directory every host can
# read: /vagrant/.smolder in the VMs): a CA, the aggregator's certificate for its address, one
# token per agent host (scope ingest), Prometheus' token (scope read) and an admin token (for
# you, and for the multi-host test's queries).
# Usage: credentials.sh <aggregator-ip> <agent-name>...
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

aggregator_ip=$1
shift
share="${SMOLDER_SHARE:-/vagrant/.smolder}"
mkdir -p "$share"
cd "$share"
if [ ! -f ca.pem ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
        -subj "/CN=Smolder fleet CA" -keyout ca.key -out ca.pem 2>/dev/null
fi
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=aggregator" \
    -keyout aggregator.key -out aggregator.csr 2>/dev/null
printf 'subjectAltName=IP:%s,DNS:aggregator\n' "$aggregator_ip" >aggregator.ext
openssl x509 -req -in aggregator.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
    -extfile aggregator.ext -out aggregator.pem 2>/dev/null
for name in "$@" prometheus admin; do
    [ -f "token-$name" ] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"token-$name"
done
chmod 0644 ca.pem aggregator.pem
chmod 0600 ca.key aggregator.key token-*

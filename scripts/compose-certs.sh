#!/usr/bin/env bash
# Makes the certificates of the TLS compose cluster (docker-compose.tls.yml)
# under DIR (default .compose-certs), unless they are there already: a CA,
# one certificate per member (n1, n2, n3, valid for its cluster address, its
# name and 127.0.0.1, used on both ports) and a client certificate (CN
# "client") for etcdctl and raftlockctl on the host. Nothing here is checked
# in; the keys are made on the machine that runs the cluster. The member keys
# are readable by the image's non-root user (uid 65532).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.compose-certs}
[ -f "$dir/client.pem" ] && exit 0
command -v openssl >/dev/null || scripts/apt-install.sh openssl
mkdir -p "$dir"
cd "$dir"
ec() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null; }
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.pem \
  -days 365 -subj "/CN=raftlock compose CA" 2>/dev/null
i=11
for n in n1 n2 n3 n4 n5; do
  ec "$n" "$n"
  printf "subjectAltName=IP:172.29.79.%s,IP:127.0.0.1,DNS:%s,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n" "$i" "$n" > ext.cnf
  openssl x509 -req -in "$n.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$n.pem" -days 365 -extfile ext.cnf 2>/dev/null
  i=$((i + 1))
done
ec client client
printf "extendedKeyUsage=clientAuth\n" > ext.cnf
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 365 -extfile ext.cnf 2>/dev/null
rm -f ./*.csr ext.cnf ca.srl
chmod 0644 n?.key
chmod 0600 ca.key client.key
echo "compose-certs: made a CA, member and client certificates in $dir" >&2

#!/usr/bin/env bash
# Certificates for raftlock-mtls.yaml in namespace NAMESPACE, under DIR:
#   ca.crt, ca.key      a CA of their own (keep ca.key off the cluster)
#   tls.crt, tls.key    the members' certificate, for both ports and both
#                       directions: *.raftlock.NAMESPACE.svc.DOMAIN (each
#                       member), raftlock-client[.NAMESPACE[.svc[.DOMAIN]]]
#                       (the client Service), localhost and 127.0.0.1
#   client.crt, .key    a client certificate (CN "client") for raftlockctl
#                       and etcdctl outside the members
# Usage: make-certs.sh NAMESPACE DIR [CLUSTER_DOMAIN (cluster.local)] [DAYS (365)]
set -euo pipefail
ns=${1:?usage: make-certs.sh NAMESPACE DIR [CLUSTER_DOMAIN] [DAYS]}
dir=${2:?usage: make-certs.sh NAMESPACE DIR [CLUSTER_DOMAIN] [DAYS]}
domain=${3:-cluster.local}
days=${4:-365}
mkdir -p "$dir"
cd "$dir"
key() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null; }
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.crt \
  -days "$days" -subj "/CN=raftlock CA ($ns)" 2>/dev/null
key tls "raftlock member"
san="DNS:*.raftlock.$ns.svc.$domain,DNS:*.raftlock.$ns.svc,DNS:raftlock-client,DNS:raftlock-client.$ns"
san="$san,DNS:raftlock-client.$ns.svc,DNS:raftlock-client.$ns.svc.$domain,DNS:localhost,IP:127.0.0.1"
printf "subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n" "$san" > ext.cnf
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tls.crt -days "$days" -extfile ext.cnf 2>/dev/null
key client client
printf "extendedKeyUsage=clientAuth\n" > ext.cnf
openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days "$days" -extfile ext.cnf 2>/dev/null
rm -f ./*.csr ext.cnf ca.srl
chmod 0600 ca.key tls.key client.key
echo "make-certs: a CA, the members' and a client certificate for namespace $ns in $dir" >&2

#!/usr/bin/env bash
# The compose cluster with TLS on both ports and mutual authentication:
# makes the certificates first (scripts/compose-certs.sh, into .compose-certs),
# then runs `docker compose` with docker-compose.tls.yml over
# docker-compose.yml and the arguments given, e.g.
#   scripts/compose-tls.sh up -d
#   etcdctl --endpoints=https://127.0.0.1:12379 --cacert .compose-certs/ca.pem \
#     --cert .compose-certs/client.pem --key .compose-certs/client.key member list
#   scripts/compose-tls.sh down -v
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/compose-certs.sh .compose-certs
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
exec "${compose[@]}" -f docker-compose.yml -f docker-compose.tls.yml "$@"

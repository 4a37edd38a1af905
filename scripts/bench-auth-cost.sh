#!/usr/bin/env bash
# What etcd auth costs raftlock, measured A/B on one 3-member cluster: the
# same workloads (raftlockctl bench) alternately with auth off and with auth
# on — simple tokens, the client a non-root user whose role may read and write
# the bench's keys — for ROUNDS rounds, so that both modes see the same
# machine, data and leader. Prints, per workload, the median ops/s off and on,
# the cost, and each mode's spread (min-max over the rounds).
#
#   scripts/bench-auth-cost.sh           # ROUNDS=5
#   ROUNDS=9 BIN_DIR=dir scripts/bench-auth-cost.sh
#   WORKLOADS="get --clients 64 --conns 8 --total 40000" scripts/bench-auth-cost.sh
#                                        # only these (';'-separated)
set -euo pipefail
cd "$(dirname "$0")/.."
etcd_dir=$(scripts/install-etcd.sh)
bin=$(scripts/release-bins.sh)
rounds=${ROUNDS:-5}
work=$(pwd)/.bench-auth
rm -rf "$work"; mkdir -p "$work"

pids=()
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop_all EXIT
base=25790 cluster=""
for i in 0 1 2; do cluster+="${cluster:+,}n$i=http://127.0.0.1:$((base+10+i))"; done
for i in 0 1 2; do
  "$bin/raftlock" --name "n$i" --data-dir "$work/n$i" \
    --listen-client-urls "http://127.0.0.1:$((base+i))" --advertise-client-urls "http://127.0.0.1:$((base+i))" \
    --listen-peer-urls "http://127.0.0.1:$((base+10+i))" --initial-advertise-peer-urls "http://127.0.0.1:$((base+10+i))" \
    --initial-cluster "$cluster" >"$work/n$i.log" 2>&1 &
  pids+=($!)
done
endpoints="127.0.0.1:$base,127.0.0.1:$((base+1)),127.0.0.1:$((base+2))"
for _ in $(seq 100); do "$bin/raftlockctl" --endpoints "$endpoints" bench put --total 3 >/dev/null 2>&1 && break; sleep 0.2; done

export ETCDCTL_API=3
etcdctl=("$etcd_dir/etcdctl" --endpoints="$endpoints")
"${etcdctl[@]}" user add root:rootpw >/dev/null
"${etcdctl[@]}" role add bench >/dev/null
"${etcdctl[@]}" role grant-permission bench readwrite bench --prefix=true >/dev/null
"${etcdctl[@]}" user add bench:benchpw >/dev/null
"${etcdctl[@]}" user grant-role bench bench >/dev/null

workloads=(
  "put --clients 1 --conns 1 --total 2000"
  "put --clients 64 --conns 8 --total 30000"
  "get --clients 1 --conns 1 --total 3000"
  "get --clients 64 --conns 8 --total 40000"
  "txn --clients 64 --conns 8 --total 30000"
  "lock --clients 64 --conns 8 --lock-names 64 --total 10000"
)
[ -n "${WORKLOADS:-}" ] && IFS=';' read -r -a workloads <<<"$WORKLOADS"
for r in $(seq "$rounds"); do
  for mode in off on; do
    user=()
    if [ "$mode" = on ]; then
      "${etcdctl[@]}" auth enable >/dev/null; user=(--user bench:benchpw)
    fi
    for w in "${workloads[@]}"; do
      # shellcheck disable=SC2086 # a workload is its words
      result=$("$bin/raftlockctl" --endpoints "$endpoints" "${user[@]}" -w json bench $w)
      echo "{\"round\":$r,\"mode\":\"$mode\",\"workload\":\"$w\",\"r\":$result}" | tee -a "$work/results.jsonl" >&2
    done
    [ "$mode" = on ] && "${etcdctl[@]}" --user root:rootpw auth disable >/dev/null
  done
done

python3 - "$work/results.jsonl" "$rounds" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["workload"], {}).setdefault(r["mode"], []).append(r["r"]["ops_per_sec"])
print(f"raftlock, 3 members, auth off vs on (non-root user, simple token), {sys.argv[2]} alternating rounds")
print(f"{'workload':<58} {'off (median, min-max)':>26} {'on (median, min-max)':>26} {'cost':>6}")
for w, m in by.items():
    off, on = m["off"], m["on"]
    mo, mn = statistics.median(off), statistics.median(on)
    print(f"{w:<58} {mo:>8.0f} ({min(off):>6.0f}-{max(off):>6.0f}) {mn:>10.0f} ({min(on):>6.0f}-{max(on):>6.0f}) {100*(mn-mo)/mo:>5.1f}%")
PY

#!/usr/bin/env bash
# Side-by-side benchmark: a 3-member etcd 3.5.1 cluster and a 3-member raftlock
# cluster on this machine, one after the other in one run, measured by the same
# client (`raftlockctl bench`). Prints each result and the raftlock/etcd ratios,
# with the share of CPU time the hypervisor took meanwhile (steal).
#
#   scripts/bench.sh            # full run
#   QUICK=1 scripts/bench.sh    # fewer requests, for a smoke test
#   BIN_DIR=dir scripts/bench.sh   # raftlock and raftlockctl from dir (say, an
#                               # older build to compare with), not built here
#   TLS=1 scripts/bench.sh      # both systems with TLS and client certificates
#                               # required on the client and peer ports
#   AUTH=1 scripts/bench.sh     # both systems with etcd's auth on (simple
#                               # tokens); the client is a user whose role
#                               # may read and write the bench's keys
#   scripts/bench.sh memory     # memory instead: RSS per member after 300k
#                               # puts of 1 KiB (100k keys, so 2/3 of it is
#                               # history), then after compaction + defrag;
#                               # and raftlock with a 100 MB quota
set -euo pipefail
cd "$(dirname "$0")/.."
etcd_dir=$(scripts/install-etcd.sh)
bin=$(scripts/release-bins.sh)
ctl=$bin/raftlockctl
work=$(pwd)/.bench
rm -rf "$work"; mkdir -p "$work"
scale=1; [ "${QUICK:-}" = 1 ] && scale=10

scheme=http; tls_args=()
if [ "${TLS:-}" = 1 ]; then
  # One CA; each member's certificate (valid for 127.0.0.1) on both ports;
  # the bench client and etcdctl present the client certificate.
  scripts/compose-certs.sh "$work/certs"
  scheme=https
  export RAFTLOCK_CACERT=$work/certs/ca.pem RAFTLOCK_CERT=$work/certs/client.pem RAFTLOCK_KEY=$work/certs/client.key
  export ETCDCTL_CACERT=$RAFTLOCK_CACERT ETCDCTL_CERT=$RAFTLOCK_CERT ETCDCTL_KEY=$RAFTLOCK_KEY
fi
member_tls() { # i: the TLS flags of member i (same names for etcd and raftlock)
  [ "$scheme" = https ] || return 0
  local c=$work/certs/n$(($1 + 1))
  tls_args=(--cert-file "$c.pem" --key-file "$c.key" --trusted-ca-file "$work/certs/ca.pem" --client-cert-auth
    --peer-cert-file "$c.pem" --peer-key-file "$c.key" --peer-trusted-ca-file "$work/certs/ca.pem" --peer-client-cert-auth)
}

# With AUTH=1: root enables auth, and the bench runs as user "bench", whose
# role may read and write every key starting with "bench" (its keys and locks).
user_args=()
enable_auth() { # endpoints
  local e=("$etcd_dir/etcdctl" --endpoints="$1")
  export ETCDCTL_API=3
  "${e[@]}" user add root:rootpw >/dev/null
  "${e[@]}" auth enable >/dev/null
  "${e[@]}" --user root:rootpw role add bench >/dev/null
  "${e[@]}" --user root:rootpw role grant-permission bench readwrite bench --prefix=true >/dev/null
  "${e[@]}" --user root:rootpw user add bench:benchpw >/dev/null
  "${e[@]}" --user root:rootpw user grant-role bench bench >/dev/null
  user_args=(--user bench:benchpw)
}

pids=(); extra_args=()
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap stop_all EXIT

start_cluster() { # kind base_port
  local kind=$1 base=$2 cluster="" i
  for i in 0 1 2; do cluster+="${cluster:+,}n$i=$scheme://127.0.0.1:$((base+10+i))"; done
  for i in 0 1 2; do
    member_tls "$i"
    local args=(--name "n$i" --data-dir "$work/$kind-n$i"
      --listen-client-urls "$scheme://127.0.0.1:$((base+i))" --advertise-client-urls "$scheme://127.0.0.1:$((base+i))"
      --listen-peer-urls "$scheme://127.0.0.1:$((base+10+i))" --initial-advertise-peer-urls "$scheme://127.0.0.1:$((base+10+i))"
      --initial-cluster "$cluster" --initial-cluster-state new "${tls_args[@]}" "${extra_args[@]}")
    if [ "$kind" = etcd ]; then
      "$etcd_dir/etcd" "${args[@]}" --log-level error >"$work/$kind-n$i.log" 2>&1 &
    else
      "$bin/raftlock" "${args[@]}" >"$work/$kind-n$i.log" 2>&1 &
    fi
    pids+=($!)
  done
  endpoints="$scheme://127.0.0.1:$base,$scheme://127.0.0.1:$((base+1)),$scheme://127.0.0.1:$((base+2))"
  for _ in $(seq 100); do
    "$ctl" --endpoints "$endpoints" bench put --total 3 >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "$kind cluster did not start" >&2; exit 1
}

is_leader() { # endpoint: asks with etcdctl whether it leads
  ETCDCTL_API=3 "$etcd_dir/etcdctl" --endpoints="$1" endpoint status -w json 2>/dev/null \
    | python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["Status"]; sys.exit(0 if s["leader"]==s["header"]["member_id"] else 1)'
}

suite() { # kind
  local kind=$1
  # Each result also records the share of CPU time the hypervisor took from
  # this VM meanwhile (steal): a run with much of it measured a busy host.
  run_on() { local eps=$1 label=$2; shift 2
    local before after result
    before=$(head -1 /proc/stat)
    result=$("$ctl" --endpoints "$eps" "${user_args[@]}" -w json bench "$@")
    after=$(head -1 /proc/stat)
    local steal
    steal=$(python3 -c 'import sys; a, b = ([int(x) for x in s.split()[1:]] for s in sys.argv[1:]); d = [y - x for x, y in zip(a, b)]; print(round(100 * d[7] / max(sum(d), 1), 1))' "$before" "$after")
    echo "{\"system\":\"$kind\",\"args\":\"$*$label\",\"steal_pct\":$steal,\"r\":$result}" | tee -a "$work/results.jsonl" >&2; }
  run() { run_on "$endpoints" "" "$@"; }
  # One client, on the leader and on a follower: the follower forwards.
  local leader follower ep
  for ep in ${endpoints//,/ }; do
    if "$ctl" --endpoints "$ep" "${user_args[@]}" -w json bench get --total 1 >/dev/null 2>&1 && is_leader "$ep"; then leader=$ep; else follower=$ep; fi
  done
  run_on "$leader" " (leader)" put --clients 1 --conns 1 --total $((5000/scale))
  run_on "$follower" " (follower)" put --clients 1 --conns 1 --total $((5000/scale))
  run put --clients 64 --conns 8 --total $((60000/scale))
  run get --clients 1 --conns 1 --total $((5000/scale))
  run get --clients 64 --conns 8 --total $((60000/scale))
  run txn --clients 64 --conns 8 --total $((60000/scale))
  # Locks through etcd's Lock service (lock then unlock is one op): handoffs
  # of one lock among 16 clients, 64 clients on distinct locks, one client.
  run_on "$leader" "" lock --clients 16 --conns 4 --lock-names 1 --total $((4000/scale))
  run_on "$leader" "" lock --clients 64 --conns 8 --lock-names 64 --total $((20000/scale))
  run_on "$leader" "" lock --clients 1 --conns 1 --lock-names 1 --total $((2000/scale))
  if [ "$kind" = raftlock ]; then # the native API: acquire (waiting) then fenced release
    run_on "$leader" "" native-lock --clients 16 --conns 4 --lock-names 1 --total $((4000/scale))
    run_on "$leader" "" native-lock --clients 64 --conns 8 --lock-names 64 --total $((20000/scale))
    run_on "$leader" "" native-lock --clients 1 --conns 1 --lock-names 1 --total $((2000/scale))
  fi
}

# RSS of each running member, in MB, comma-separated.
rss_mb() { local p out=""
  for p in "${pids[@]}"; do out+="${out:+,}$(awk '/^VmRSS/ {printf "%.0f", $2/1024}' "/proc/$p/status")"; done
  echo "$out"; }

memory() { # kind [extra raftlock flags...]: one row of the memory table
  local kind=$1 label=$1; shift
  [ $# -gt 0 ] && label="$kind $*"
  extra_args=("$@")
  rm -rf "$work/$kind"-n*
  start_cluster "$kind" $([ "$kind" = etcd ] && echo 23790 || echo 24790)
  local writes=$((300000/scale)) report
  # Past a quota the bench reports its refused requests: keep the report.
  report=$("$ctl" --endpoints "$endpoints" -w json bench put --clients 64 --conns 8 --total $writes \
    --value-size 1024 --key-space $((100000/scale)) || true)
  sleep 2
  local after_writes; after_writes=$(rss_mb)
  local rev
  rev=$(ETCDCTL_API=3 "$etcd_dir/etcdctl" --endpoints="${endpoints%%,*}" endpoint status -w json \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])')
  ETCDCTL_API=3 "$etcd_dir/etcdctl" --command-timeout=120s --endpoints="$endpoints" compact "$rev" >/dev/null
  ETCDCTL_API=3 "$etcd_dir/etcdctl" --command-timeout=120s --endpoints="$endpoints" defrag >/dev/null
  sleep 3
  echo "{\"system\":\"$label\",\"writes\":$writes,\"rss_after_writes\":[$after_writes],\"rss_after_compaction\":[$(rss_mb)],\"bench\":${report:-null}}" \
    | tee -a "$work/memory.jsonl" >&2
  stop_all; extra_args=()
}

if [ "${1:-}" = memory ]; then
  memory etcd
  memory raftlock
  memory raftlock --quota-backend-bytes 100000000
  python3 - "$work/memory.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'system':<44} {'writes':>7} {'done':>7} {'RSS after writes (MB)':>24} {'after compact+defrag':>22} {'bytes/write':>11}")
for r in rows:
    done = int(r["bench"]["total"] - r["bench"]["errors"]) if r.get("bench") else 0
    w, c = r["rss_after_writes"], r["rss_after_compaction"]
    per = max(w) * 1e6 / max(done, 1)
    print(f"{r['system']:<44} {r['writes']:>7} {done:>7} {'/'.join(map(str, w)):>24} {'/'.join(map(str, c)):>22} {per:>11.0f}")
PY
  exit 0
fi

echo "== etcd 3.5.1, 3 members" >&2
start_cluster etcd 23790; [ "${AUTH:-}" = 1 ] && enable_auth "$endpoints"; suite etcd; stop_all; user_args=()
echo "== raftlock, 3 members" >&2
start_cluster raftlock 24790; [ "${AUTH:-}" = 1 ] && enable_auth "$endpoints"; suite raftlock; stop_all

[ "$scheme" = https ] && echo "TLS: client and peer ports with certificates required (mTLS), both systems"
[ "${AUTH:-}" = 1 ] && echo "AUTH: etcd auth on, simple tokens, the client a non-root user with a prefix permission, both systems"
python3 - "$work/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["args"], {})[r["system"]] = dict(r["r"], steal=r.get("steal_pct", 0.0))
print(f"{'workload':<48} {'etcd ops/s':>10} {'raftlock':>10} {'ratio':>6}   {'etcd p50':>9} {'raftlock':>9}   {'etcd p99':>9} {'raftlock':>9}   {'steal % (etcd/raftlock)':>23}")
for args, s in by.items():
    e, r = s.get("etcd"), s.get("raftlock")
    if not r: continue
    if not e:  # raftlock only (its native API): compare with etcd's Lock service
        e = by.get(args.replace("native-lock", "lock"), {}).get("etcd")
        args += " vs etcd lock"
    if not e: continue
    print(f"{args:<48} {e['ops_per_sec']:>10.0f} {r['ops_per_sec']:>10.0f} {r['ops_per_sec']/e['ops_per_sec']:>5.2f}x"
          f"   {e['p50_ms']:>7.3f}ms {r['p50_ms']:>7.3f}ms   {e['p99_ms']:>7.3f}ms {r['p99_ms']:>7.3f}ms"
          f"   {e['steal']:>11.1f} / {r['steal']:<9.1f}")
PY

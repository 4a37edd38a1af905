#!/usr/bin/env bash
# Side-by-side benchmark: a 3-member etcd 3.5.1 cluster and a 3-member raftlock
# cluster on this machine, one after the other in one run, measured by the same
# clients: raftlockctl's own (`raftlockctl bench`) and the `etcd-client` crate
# applications use (`raftlockctl bench --driver etcd-client`, each connection
# balanced over all members). Prints each result and the raftlock/etcd ratios,
# with the share of CPU time the hypervisor took meanwhile (steal); then the
# same for five members; then sweeps 1, 4, 16, 64 and 256 clients (put, and
# lock+unlock on distinct locks, etcd-client driver) and draws throughput and
# p50/p99 latency against clients: .bench/results.txt holds the tables,
# .bench/results.svg the picture.
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
#   scripts/bench.sh stall      # no stalls instead: 16 clients put while
#                               # heavy work runs on a 1M-key store (see
#                               # stall() below)
#   scripts/bench.sh failover   # failover instead: rounds of kill -9, then of
#                               # SIGTERM, of the leader while one client
#                               # writes through each follower; the longest
#                               # gap between two acknowledged writes, for
#                               # the client on the new leader and the other
#                               # (FAILOVER_ROUNDS, default 10 and 5)
#   scripts/bench.sh observers  # lock handoffs with 0 and with 1,000 lock-event
#                               # streams (Observe) on the lock, alternating
#                               # (ROUNDS, default 3), saturated and at a fixed
#                               # pace (RATE handoffs/s, default 50);
#                               # OBSERVERS_APART=1: the observers in a
#                               # process of their own, at nice 19
#   scripts/bench.sh storm      # a lease-expiry storm instead: STORM_LEASES
#                               # (default 100,000) leases lapse at once
#                               # while 16 clients put (see storm() below;
#                               # ROUNDS runs, default 3)
#   scripts/bench.sh queue      # long queues instead: N clients take turns on
#                               # one lock (N-1 wait), for each N in
#                               # QUEUE_LENGTHS (default 10 100 1000 10000):
#                               # handoffs/s, the time a client waits in the
#                               # queue (p50/p99), members' CPU per handoff
#                               # (see queue() below; ROUNDS, default 1;
#                               # QUEUE_SYSTEMS, default "etcd raftlock";
#                               # QUEUE_PERMITS > 1: a semaphore of that
#                               # many, raftlock's native Acquire alone)
#   scripts/bench.sh watchers   # watch fan-out instead: for each N in
#                               # WATCHERS (default 1000 10000), N watchers
#                               # (100 a stream) on one key, on N keys, on N
#                               # prefixes and on N ranges that are no
#                               # prefix; one put at a time, timed from its
#                               # sending and from its answer to the last
#                               # event it causes; members' CPU per event
#                               # (ROUNDS, default 1; WATCHERS_SYSTEMS,
#                               # default "etcd raftlock")
#   scripts/bench.sh held       # many held locks instead: for each N in
#                               # HELD_LOCKS (default 1000 10000 100000), a
#                               # fresh cluster holding N locks, each on a
#                               # lease of its own; RSS per held lock per
#                               # member, lock+unlock p50/p99 on 64 other
#                               # names (etcd's Lock, and raftlock's native
#                               # Acquire), and on raftlock the time to List
#                               # a page of 1,000 of them and all of them,
#                               # then to List one lock with N owner keys
#                               # and Describe 1,000 of its waiters
#                               # (HELD_SYSTEMS, default "etcd raftlock")
#   scripts/bench.sh keys       # many keys instead: for each N in KEYS
#                               # (default 1000 10000 100000), a fresh
#                               # cluster given N keys of 256 bytes; RSS
#                               # per key per member, a range of 1,000 keys
#                               # and a count-only range over all N, p50/p99
#                               # (etcd-client driver)
#   scripts/bench.sh scale      # how cost grows, all in one run: held,
#                               # queue, storm, watchers and keys for each N
#                               # in SCALE_N (default 1000 10000 100000;
#                               # queues of 10 and each N; watchers up to
#                               # 10,000), both systems; a
#                               # table per workload (.bench/scale.txt) and
#                               # their log-log plot (.bench/scale.svg).
#                               # About 28 minutes on 2 cores; ROUNDS=3
#                               # runs it all three times (84 minutes) and
#                               # gives each cell's median (and range).
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

pids=(); extra_args=(); raftlock_args=()
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap stop_all EXIT

members=3 # the cluster size start_cluster starts
start_member() { # kind base_port i: starts member i (again, after a kill) as pids[i]
  local kind=$1 base=$2 i=$3 cluster="" j
  for j in $(seq 0 $((members - 1))); do cluster+="${cluster:+,}n$j=$scheme://127.0.0.1:$((base+10+j))"; done
  member_tls "$i"
  local args=(--name "n$i" --data-dir "$work/$kind-n$i"
    --listen-client-urls "$scheme://127.0.0.1:$((base+i))" --advertise-client-urls "$scheme://127.0.0.1:$((base+i))"
    --listen-peer-urls "$scheme://127.0.0.1:$((base+10+i))" --initial-advertise-peer-urls "$scheme://127.0.0.1:$((base+10+i))"
    --initial-cluster "$cluster" --initial-cluster-state new "${tls_args[@]}" "${extra_args[@]}")
  if [ "$kind" = etcd ]; then
    "$etcd_dir/etcd" "${args[@]}" --log-level error >>"$work/$kind-n$i.log" 2>&1 &
  else
    "$bin/raftlock" "${args[@]}" "${raftlock_args[@]}" >>"$work/$kind-n$i.log" 2>&1 &
  fi
  pids[$i]=$!
}

start_cluster() { # kind base_port
  local kind=$1 base=$2 i
  endpoints=""
  for i in $(seq 0 $((members - 1))); do
    start_member "$kind" "$base" "$i"
    endpoints+="${endpoints:+,}$scheme://127.0.0.1:$((base+i))"
  done
  # Every member answers (a put through each): a quorum alone would hide a
  # member that did not start until a command connects to it.
  local ready
  for _ in $(seq 100); do
    ready=0
    for i in $(seq 0 $((members - 1))); do
      "$ctl" --endpoints "$scheme://127.0.0.1:$((base+i))" bench put --total 1 >/dev/null 2>&1 && ready=$((ready + 1))
    done
    [ "$ready" = "$members" ] && return 0
    sleep 0.2
  done
  echo "$kind cluster did not start; its members' logs end with:" >&2
  for i in $(seq 0 $((members - 1))); do
    echo "--- $kind-n$i (pid ${pids[$i]}$(kill -0 "${pids[$i]}" 2>/dev/null || echo ', exited'))" >&2
    tail -n 5 "$work/$kind-n$i.log" >&2 || true
  done
  exit 1
}

is_leader() { # endpoint: asks with etcdctl whether it leads
  ETCDCTL_API=3 "$etcd_dir/etcdctl" --endpoints="$1" endpoint status -w json 2>/dev/null \
    | python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["Status"]; sys.exit(0 if s["leader"]==s["header"]["member_id"] else 1)'
}

status_field() { # endpoint field: one field of etcdctl's endpoint status
  ETCDCTL_API=3 "$etcd_dir/etcdctl" --endpoints="$1" endpoint status -w json 2>/dev/null \
    | python3 -c "import json,sys; s=json.load(sys.stdin)[0]['Status']; print(s['$2'] if '$2' in s else s['header']['$2'])"
}
max_term() { local ep t max=0
  for ep in ${endpoints//,/ }; do t=$(status_field "$ep" raft_term || echo 0); [ "$t" -gt "$max" ] && max=$t; done
  echo "$max"; }

# run_on endpoints label bench-args...: one measured row, of the system
# $kind (the caller's). Each result also records the share of CPU time the hypervisor took from
# this VM meanwhile (steal): a run with much of it measured a busy host.
# And the elections during it (the highest Raft term's rise): a loaded
# cluster must not change leaders. The bench reports where the machine's
# CPU went over its measured run: its own, and the members' (given their
# process IDs).
run_on() { local eps=$1 label=$2; shift 2
  local before after result term_before
  term_before=$(max_term)
  before=$(head -1 /proc/stat)
  result=$("$ctl" --endpoints "$eps" "${user_args[@]}" -w json bench "$@" --server-pids "$(IFS=,; echo "${pids[*]}")")
  after=$(head -1 /proc/stat)
  local steal elections
  steal=$(python3 -c 'import sys; a, b = ([int(x) for x in s.split()[1:]] for s in sys.argv[1:]); d = [y - x for x, y in zip(a, b)]; print(round(100 * d[7] / max(sum(d), 1), 1))' "$before" "$after")
  elections=$(($(max_term) - term_before))
  echo "{\"system\":\"$kind\",\"args\":\"$*$label\",\"steal_pct\":$steal,\"elections\":$elections,\"r\":$result}" | tee -a "$work/results.jsonl" >&2; }
run() { run_on "$endpoints" "" "$@"; }

suite() { # kind
  local kind=$1
  # One client, on the leader and on a follower: the follower forwards.
  local leader="" follower="" ep
  for _ in $(seq 50); do # until one member says it leads (not during an election)
    leader=""; follower=""
    for ep in ${endpoints//,/ }; do
      if "$ctl" --endpoints "$ep" "${user_args[@]}" -w json bench get --total 1 >/dev/null 2>&1 && is_leader "$ep"; then leader=$ep; else follower=$ep; fi
    done
    [ -n "$leader" ] && [ -n "$follower" ] && break
    sleep 0.2
  done
  [ -n "$leader" ] || { echo "$kind: no member says it leads" >&2; exit 1; }
  run_on "$leader" " (leader)" put --clients 1 --conns 1 --total $((5000/scale))
  run_on "$follower" " (follower)" put --clients 1 --conns 1 --total $((5000/scale))
  run put --clients 64 --conns 8 --total $((60000/scale))
  # On the leader: the first endpoint leads in some runs and not in others.
  run_on "$leader" " (leader)" get --clients 1 --conns 1 --total $((5000/scale))
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
  # As applications see it: the etcd-client crate, 64 tasks sharing 4
  # clients, each balanced over every member (so most requests reach a
  # follower), one lease per task for locks.
  local ec=(--driver etcd-client)
  run_on "$leader" " (leader)" put "${ec[@]}" --clients 1 --conns 1 --total $((5000/scale))
  run_on "$follower" " (follower)" put "${ec[@]}" --clients 1 --conns 1 --total $((5000/scale))
  run put "${ec[@]}" --clients 64 --conns 4 --total $((60000/scale))
  run put "${ec[@]}" --clients 64 --conns 4 --value-size 1024 --total $((60000/scale))
  run txn "${ec[@]}" --clients 64 --conns 4 --total $((60000/scale))
  run lock "${ec[@]}" --clients 16 --conns 4 --lock-names 1 --total $((4000/scale))
  run lock "${ec[@]}" --clients 64 --conns 4 --lock-names 64 --total $((20000/scale))
  # The same 64 tasks sharing one client (a connection to each member), as
  # an application that clones one etcd-client `Client` does: fewer
  # connections cost both systems less CPU per request, and the ratio
  # stayed near 2x either way (docs/performance-notes.md). Last, so that
  # the rows before it meet the store as earlier runs left it.
  run put "${ec[@]}" --clients 64 --conns 1 --total $((60000/scale))
}

# Five members: put and lock+unlock with 64 clients, both drivers, spread
# over every member.
suite_five() { # kind
  local kind=$1
  run_on "$endpoints" " (5 members)" put --clients 64 --conns 10 --total $((60000/scale))
  run_on "$endpoints" " (5 members)" lock --clients 64 --conns 10 --lock-names 64 --total $((20000/scale))
  run_on "$endpoints" " (5 members)" put --driver etcd-client --clients 64 --conns 4 --total $((60000/scale))
  run_on "$endpoints" " (5 members)" lock --driver etcd-client --clients 64 --conns 4 --lock-names 64 \
    --total $((20000/scale))
}

# The sweep for the picture: 1, 4, 16, 64 and 256 clients (etcd-client, at
# most 4 clients balanced over every member), put and lock+unlock on
# distinct locks, each point a fixed time.
sweep() { # kind
  local kind=$1 c conns seconds=$((scale == 1 ? 5 : 1)) result
  for c in 1 4 16 64 256; do
    conns=$((c < 4 ? c : 4))
    for workload in put lock; do
      result=$("$ctl" --endpoints "$endpoints" "${user_args[@]}" -w json bench "$workload" --driver etcd-client \
        --clients "$c" --conns "$conns" --lock-names "$c" --seconds "$seconds" --total 1000000000)
      echo "{\"system\":\"$kind\",\"workload\":\"$workload\",\"clients\":$c,\"r\":$result}" \
        | tee -a "$work/sweep.jsonl" >&2
    done
  done
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

# The no-stall run: 1M keys written twice (so half the versions are history),
# then 16 clients put for 15 s while, 3 s in, one piece of heavy work runs:
# none (the baseline), a watch reading all history back, a backup
# (Maintenance.Snapshot, which encodes the whole state as a checkpoint
# does), a compaction of all history, and a member restarted after the log
# it missed was purged, so that it is sent a snapshot. For that last one,
# both clusters restart with snapshots far more frequent than by default
# (etcd every 10,000 entries, raftlock every 20,000: its entries are
# proposal batches) and a follower misses 30,000 puts of one client. Each
# row gives the writers' figures in that window and the elections (raft term
# changes) during it.
stall() { # kind
  local kind=$1 base keys=$((1000000/scale)) leader_i follower_i
  base=$([ "$kind" = etcd ] && echo 23790 || echo 24790)
  rm -rf "$work/$kind"-n*
  start_cluster "$kind" "$base"
  echo "== $kind: writing $keys keys twice" >&2
  for _ in 1 2; do
    "$ctl" --endpoints "$endpoints" bench put --sequential --total "$keys" --key-space "$keys" --value-size 100 \
      --clients 64 --conns 8 >/dev/null
  done
  find_leader() { local i
    for i in 0 1 2; do
      if is_leader "$scheme://127.0.0.1:$((base+i))"; then leader_i=$i; else follower_i=$i; fi
    done; }
  find_leader
  window() { # event command...: the event runs 3 s into 15 s of writes
    local event=$1; shift
    local before after started took
    before=$(max_term)
    "$ctl" --endpoints "${window_eps:-$endpoints}" -w json bench put --clients 16 --conns 4 --seconds 15 --total 1000000000 \
      --key-space "$keys" --value-size 100 >"$work/window.json" &
    local writer=$!
    sleep 3
    started=$(date +%s.%N)
    "$@" >"$work/event.out" 2>&1 || echo "$event: the event failed: $(tail -2 "$work/event.out")" >&2
    took=$(python3 -c "import time; print(round(time.time() - $started, 2))")
    wait "$writer" || true # a report with failed requests is kept
    after=$(max_term)
    echo "{\"system\":\"$kind\",\"event\":\"$event\",\"event_seconds\":$took,\"elections\":$((after - before)),\"r\":$(cat "$work/window.json")}" \
      | tee -a "$work/stall.jsonl" >&2
  }
  catch_up() { # restart the killed follower; wait until it has the leader's revision
    start_member "$kind" "$base" "$follower_i"
    local target; target=$(status_field "$scheme://127.0.0.1:$((base+leader_i))" revision)
    for _ in $(seq 600); do
      [ "$(status_field "$scheme://127.0.0.1:$((base+follower_i))" revision 2>/dev/null || echo 0)" -ge "$target" ] && return 0
      sleep 0.1
    done
    return 1
  }
  window none true
  window watch-history "$ctl" --endpoints "$scheme://127.0.0.1:$((base+follower_i))" bench watch-history \
    --start-revision 2 --seconds 11
  window backup env ETCDCTL_API=3 "$etcd_dir/etcdctl" --command-timeout=120s \
    --endpoints="$scheme://127.0.0.1:$((base+leader_i))" snapshot save "$work/backup.db"
  local rev; rev=$(status_field "$scheme://127.0.0.1:$((base+leader_i))" revision)
  window compact env ETCDCTL_API=3 "$etcd_dir/etcdctl" --command-timeout=120s --endpoints="$endpoints" \
    compact "$rev" --physical

  stop_all
  if [ "$kind" = etcd ]; then extra_args=(--snapshot-count 10000)
  else extra_args=(--snapshot-count 20000 --snapshot-catchup-entries 100); fi
  start_cluster "$kind" "$base"
  for _ in $(seq 100); do "$ctl" --endpoints "$endpoints" bench put --total 3 >/dev/null 2>&1 && break; sleep 0.2; done
  find_leader
  kill -9 "${pids[$follower_i]}"; wait "${pids[$follower_i]}" 2>/dev/null || true
  "$ctl" --endpoints "$scheme://127.0.0.1:$((base+leader_i))" bench put --clients 1 --total $((30000/scale)) \
    --key-space "$keys" --value-size 100 >/dev/null
  local i; window_eps=""
  for i in 0 1 2; do [ "$i" = "$follower_i" ] || window_eps+="${window_eps:+,}$scheme://127.0.0.1:$((base+i))"; done
  window lagging-member catch_up
  stop_all; extra_args=(); window_eps=""
}

# The failover run: each round, one client puts and one reads (linearizable
# gets) in a loop through each follower (one request at a time, 6 s); 2 s
# in, the leader is killed with the signal; the round records each client's
# longest gap between two successful requests, and whether its member is the
# new leader. The member
# is restarted, and the cluster given 3 s, before the next round.
leader_index() { local i; for i in 0 1 2; do is_leader "$scheme://127.0.0.1:$(($1+i))" && { echo "$i"; return 0; }; done; return 1; }
failover() { # kind
  local kind=$1 base sig rounds r i leader_i new_leader writers
  base=$([ "$kind" = etcd ] && echo 25790 || echo 26790)
  rm -rf "$work/$kind"-n*
  start_cluster "$kind" "$base"
  for sig in KILL TERM; do
    rounds=${FAILOVER_ROUNDS:-$([ "$sig" = KILL ] && echo 10 || echo 5)}
    for r in $(seq "$rounds"); do
      for _ in $(seq 50); do leader_i=$(leader_index "$base") && break; sleep 0.2; done
      writers=()
      for i in 0 1 2; do
        [ "$i" = "$leader_i" ] && continue
        for op in put get; do
          "$ctl" --endpoints "$scheme://127.0.0.1:$((base+i))" -w json bench "$op" --clients 1 --conns 1 --seconds 6 \
            --key-space 10 --total 1000000000 "${user_args[@]}" >"$work/failover-$op-$i.json" 2>/dev/null &
          writers+=($!)
        done
      done
      sleep 2
      kill -"$sig" "${pids[$leader_i]}"
      wait "${pids[$leader_i]}" 2>/dev/null || true
      wait "${writers[@]}" || true
      new_leader=$(leader_index "$base" || echo -1)
      for i in 0 1 2; do
        [ "$i" = "$leader_i" ] && continue
        for op in put get; do
          python3 - "$work/failover-$op-$i.json" "$kind" "$sig" "$r" "$([ "$i" = "$new_leader" ] && echo successor || echo follower)" "$op" \
            >>"$work/failover.jsonl" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(json.dumps({"system": sys.argv[2], "signal": sys.argv[3], "round": int(sys.argv[4]), "client": sys.argv[5],
                  "op": sys.argv[6], "gap_ms": r["max_gap_ms"], "ops": r["total"], "errors": r["errors"]}))
PY
        done
      done
      tail -4 "$work/failover.jsonl" >&2
      start_member "$kind" "$base" "$leader_i"
      for _ in $(seq 100); do "$ctl" --endpoints "$endpoints" bench put --total 3 >/dev/null 2>&1 && break; sleep 0.2; done
      sleep 3
    done
  done
  stop_all
}

# The lease-expiry storm: N leases (STORM_LEASES, default 100,000), each
# with one key, granted with a TTL of STORM_TTL (default 120 s: etcd takes
# over a minute to grant 100,000); then leadership moves, so that the new
# leader gives every lease the same deadline a TTL later (both
# systems renew every lease in a new term; etcd spreads the deadlines it
# renews at its revocation rate). From that deadline, 16 clients put for
# 10 s (a key space written beforehand, so they add no keys) while the
# member that was not moved to is polled every 0.2 s for its key count
# (etcd_debugging_mvcc_keys_total): the time from the deadline until the
# leased keys are all gone, the puts' p50/p99/max during the first 10 s,
# elections, and the leader's CPU seconds meanwhile.
storm() { # kind run [leases]
  local kind=$1 run=$2 base n=$((${3:-${STORM_LEASES:-100000}} / scale))
  # Long enough to grant them all before the first lapses (100,000 take
  # about 40 s on etcd).
  local ttl=${STORM_TTL:-$([ "$n" -ge 50000 ] && echo 120 || echo 40)}
  base=$([ "$kind" = etcd ] && echo 23790 || echo 24790)
  rm -rf "$work/$kind"-n*
  start_cluster "$kind" "$base"
  "$ctl" --endpoints "$endpoints" bench put --sequential --total 1000 --key-space 1000 --clients 16 --conns 4 >/dev/null
  local metrics="http://127.0.0.1:$base/metrics" keys_metric=etcd_debugging_mvcc_keys_total
  keys() { curl -s "$1" | awk -v m="$keys_metric" '$1 == m {print int($2)}'; }
  local baseline; baseline=$(keys "$metrics")
  echo "== $kind, run $run: granting $n leases with a key each" >&2
  "$ctl" --endpoints "$endpoints" bench lease-key --key-prefix storm/ --sequential --total "$n" --key-space "$n" \
    --clients 64 --conns 8 --lease-ttl "$ttl" --value-size 64 >/dev/null
  local leader target target_id
  leader=$(leader_index "$base"); target=$(((leader + 1) % 3))
  target_id=$(ETCDCTL_API=3 "$etcd_dir/etcdctl" --endpoints="$scheme://127.0.0.1:$((base + target))" endpoint status -w json \
    | python3 -c 'import json,sys; print("%x" % json.load(sys.stdin)[0]["Status"]["header"]["member_id"])')
  ETCDCTL_API=3 "$etcd_dir/etcdctl" --endpoints="$scheme://127.0.0.1:$((base + leader))" move-leader "$target_id" >/dev/null
  local moved; moved=$(date +%s.%N)
  local poll="http://127.0.0.1:$((base + leader))/metrics" granted; granted=$(($(keys "$poll") - baseline))
  sleep "$(python3 -c "print(max(0, $moved + $ttl - __import__('time').time()))")"
  local term_before cpu_before; term_before=$(max_term)
  cpu_before=$(awk '{print $14 + $15}' "/proc/${pids[$target]}/stat")
  "$ctl" --endpoints "$endpoints" -w json bench put --clients 16 --conns 4 --seconds 10 --total 1000000000 \
    --key-space 1000 --value-size 100 >"$work/storm-put.json" &
  local writer=$! gone="" left
  for _ in $(seq 1500); do # 300 s at most
    left=$(($(keys "$poll") - baseline))
    if [ "$left" -le 0 ]; then gone=$(python3 -c "print(round(__import__('time').time() - ($moved + $ttl), 1))"); break; fi
    sleep 0.2
  done
  wait "$writer" || true
  local cpu_after; cpu_after=$(awk '{print $14 + $15}' "/proc/${pids[$target]}/stat")
  echo "{\"system\":\"$([ "$kind" = etcd ] && echo etcd || echo "${storm_label:-raftlock}")\",\"run\":$run,\"n\":$n,\"leases\":$granted,\"gone_after_s\":${gone:-null},\"elections\":$(($(max_term) - term_before)),\"leader_cpu_s\":$(awk "BEGIN {print ($cpu_after - $cpu_before) / $(getconf CLK_TCK)}"),\"r\":$(cat "$work/storm-put.json")}" \
    | tee -a "$work/storm.jsonl" >&2
  stop_all
}

# Long queues: N clients, each with a lease of its own, loop on one lock
# (lock, then unlock at once), so that once they all queued N-1 wait behind
# the holder and every unlock hands the lock to the next in line. Each N
# runs 2N cycles (at least 2,000; issued for 60 s at most, then the queue
# drains), the first N of them filling the queue. Reported per row: handoffs per second (the mean
# handoff takes the inverse), a handoff's time (from a release's sending
# to the next holder's grant arriving) at p50/p99, how long one cycle took
# (the wait through the whole queue) at p50/p99, and the members' CPU time
# per handoff. The clients arrive QUEUE_ARRIVALS a second (default 5,000:
# a queue of 100,000 sent at once would overrun any backlog of proposals),
# and handoffs count from when the last arrived.
# etcd's Lock service on both systems, and raftlock's native Acquire.
queue() { # kind
  local kind=$1 base n workloads
  base=$([ "$kind" = etcd ] && echo 27790 || echo 28790)
  rm -rf "$work/$kind"-n*
  start_cluster "$kind" "$base"
  # With QUEUE_PERMITS > 1, a semaphore: raftlock's native Acquire alone.
  local permits=${QUEUE_PERMITS:-1}
  workloads=(lock); [ "$permits" -gt 1 ] && workloads=()
  [ "$kind" = raftlock ] && workloads+=(native-lock)
  for n in ${QUEUE_LENGTHS:-10 100 1000 10000}; do
    for w in "${workloads[@]}"; do
      local total=$((2 * n / scale)); [ "$total" -lt $((2000 / scale)) ] && total=$((2000 / scale))
      # At most 100 waiting streams a connection (each connection serves
      # its waiters' Lock calls and its holder's Unlock alike).
      local conns=$(((n + 99) / 100)) result; [ "$conns" -lt 4 ] && conns=4
      echo "== $kind, $w, $n in the queue" >&2
      # A row in which no cycle has succeeded for QUEUE_STALL_AFTER seconds
      # (default 60), or that has not ended after 5 minutes (and 3 ms a
      # client: a queue of 100,000 takes 2 minutes to go round once, and
      # its leases minutes to grant and revoke), stalled: it is recorded as
      # such, and the cluster restarted.
      if result=$(timeout $((300 + 3 * n / 1000)) "$ctl" --endpoints "$endpoints" -w json bench "$w" --clients "$n" --conns "$conns" \
        --lock-names 1 --permits "$permits" --total "$total" --seconds 60 --arrival-rate "${QUEUE_ARRIVALS:-5000}" \
        --stall-after "${QUEUE_STALL_AFTER:-60}" \
        --server-pids "$(IFS=,; echo "${pids[*]}")"); then
        echo "{\"system\":\"$kind\",\"workload\":\"$w\",\"permits\":$permits,\"queue\":$n,\"r\":$result}" |
          tee -a "$work/queue.jsonl" >&2
      else
        echo "{\"system\":\"$kind\",\"workload\":\"$w\",\"queue\":$n,\"stalled\":true}" | tee -a "$work/queue.jsonl" >&2
        stop_all; rm -rf "$work/$kind"-n*; start_cluster "$kind" "$base"
      fi
    done
  done
  stop_all
}

# Watch fan-out (see the usage above): one row per system, N and shape, in
# .bench/watchers.jsonl. The puts reach every watcher of one key, and one
# watcher of the others.
watchers() { # kind
  local kind=$1 base n shape total result
  base=$([ "$kind" = etcd ] && echo 27790 || echo 28790)
  rm -rf "$work/$kind"-n*
  start_cluster "$kind" "$base"
  for n in ${WATCHERS:-1000 10000}; do
    for shape in one-key keys prefixes ranges; do
      total=$((1000 / scale)); [ "$shape" = one-key ] && total=$((200 / scale))
      echo "== $kind, $n watchers, $shape" >&2
      if result=$("$ctl" --endpoints "$endpoints" -w json bench watch-fanout --watchers "$n" --watch-shape "$shape" \
        --total "$total" --value-size 64 --seconds 120 --server-pids "$(IFS=,; echo "${pids[*]}")"); then
        echo "{\"system\":\"$kind\",\"watchers\":$n,\"shape\":\"$shape\",\"r\":$result}" | tee -a "$work/watchers.jsonl" >&2
      else
        echo "{\"system\":\"$kind\",\"watchers\":$n,\"shape\":\"$shape\",\"failed\":true}" | tee -a "$work/watchers.jsonl" >&2
      fi
      # Each row's watchers are gone with its streams; the next row starts
      # from a member that holds none.
    done
  done
  stop_all
}

# Many held locks (see the usage above): one row per system and N in
# .bench/held.jsonl. A held lock is what a granted lock leaves: a lease, and
# the key `name/<lease hex>` on it (`bench lease-key --owner-keys`).
rss_kib() { local p t=0; for p in "${pids[@]}"; do t=$((t + $(awk '/^VmRSS/ {print $2}' "/proc/$p/status"))); done; echo "$t"; }
held() { # kind
  local kind=$1 base n before after row w list_page list_all listed t0 t1 t2 t3 t4
  base=$([ "$kind" = etcd ] && echo 27790 || echo 28790)
  for n in ${HELD_LOCKS:-1000 10000 100000}; do
    n=$((n / scale))
    rm -rf "$work/$kind"-n*
    start_cluster "$kind" "$base"
    before=$(rss_kib)
    echo "== $kind: $n locks held" >&2
    "$ctl" --endpoints "$endpoints" bench lease-key --owner-keys --key-prefix bench-held/ --sequential --total "$n" \
      --key-space "$n" --clients 64 --conns 8 --lease-ttl 3600 --value-size 16 >/dev/null
    sleep 2
    after=$(rss_kib)
    row="{\"system\":\"$kind\",\"held\":$n,\"rss_bytes_per_lock_per_member\":$(((after - before) * 1024 / n / members))"
    for w in lock native-lock; do
      [ "$w" = native-lock ] && [ "$kind" = etcd ] && continue
      row+=",\"$w\":$("$ctl" --endpoints "$endpoints" -w json bench "$w" --clients 16 --conns 4 --lock-names 64 \
        --total $((4000 / scale)))"
    done
    if [ "$kind" = raftlock ]; then
      # Each timed from the command's start to its end (a process start and
      # a connection included, about 10 ms).
      t0=$(date +%s%N)
      "$ctl" --endpoints "$endpoints" list bench-held/ --limit 1000 >/dev/null
      t1=$(date +%s%N)
      "$ctl" --endpoints "$endpoints" -w json list bench-held/ >"$work/held-list.json"
      t2=$(date +%s%N)
      list_page=$(((t1 - t0) / 1000000)); list_all=$(((t2 - t1) / 1000000))
      listed=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["locks"]))' "$work/held-list.json")
      row+=",\"list_page_ms\":$list_page,\"list_all_ms\":$list_all,\"listed\":$listed"
      # Then one lock with N owner keys (a queue of N - 1 behind its
      # holder): List of it, and Describe of its first 1,000 waiters, before
      # and after a write has registered its queue in the index (a try-lock
      # that fails; a queue nobody has written to since a restart is not).
      "$ctl" --endpoints "$endpoints" bench lease-key --owner-keys --key-prefix bench-queue/ --key-space 1 \
        --total "$n" --clients 64 --conns 8 --lease-ttl 3600 --value-size 16 >/dev/null
      t0=$(date +%s%N)
      "$ctl" --endpoints "$endpoints" -w json list bench-queue/ >"$work/queue-list.json"
      t1=$(date +%s%N)
      "$ctl" --endpoints "$endpoints" describe bench-queue/0000000000 --limit 1000 >/dev/null
      t2=$(date +%s%N)
      "$ctl" --endpoints "$endpoints" lock --try bench-queue/0000000000 -- true >/dev/null 2>&1 || true
      t3=$(date +%s%N)
      "$ctl" --endpoints "$endpoints" describe bench-queue/0000000000 --limit 1000 >/dev/null
      t4=$(date +%s%N)
      listed=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["locks"][0]["waiters"])' \
        "$work/queue-list.json")
      row+=",\"queue_list_ms\":$(((t1 - t0) / 1000000)),\"queue_describe_ms\":$(((t2 - t1) / 1000000))"
      row+=",\"queue_describe_indexed_ms\":$(((t4 - t3) / 1000000)),\"queue_waiters_listed\":$listed"
      # Then the indexed Describe of 1,000 ten times through the leader and
      # ten through a follower (which asks the leader the page's lease
      # times): the median of each.
      local leader_i member at times
      for _ in $(seq 50); do leader_i=$(leader_index "$base") && break; sleep 0.2; done
      for member in "$leader_i" $(((leader_i + 1) % 3)); do
        times=()
        for _ in $(seq 10); do
          at=$(date +%s%N)
          "$ctl" --endpoints "$scheme://127.0.0.1:$((base + member))" describe bench-queue/0000000000 --limit 1000 >/dev/null
          times+=($((($(date +%s%N) - at) / 1000000)))
        done
        at=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 5p)
        row+=",\"queue_describe_$([ "$member" = "$leader_i" ] && echo leader || echo follower)_ms\":$at"
      done
    fi
    echo "$row}" | tee -a "$work/held.jsonl" >&2
    stop_all
  done
}

# Many keys (see the usage above): one row per system and N in
# .bench/keys.jsonl. The keys are `bench-keys/<10 digits>`, written in order
# by 64 clients; the range reads 1,000 consecutive keys from a random one.
many_keys() { # kind
  local kind=$1 base n before after row
  base=$([ "$kind" = etcd ] && echo 27790 || echo 28790)
  for n in ${KEYS:-1000 10000 100000}; do
    n=$((n / scale))
    rm -rf "$work/$kind"-n*
    start_cluster "$kind" "$base"
    before=$(rss_kib)
    echo "== $kind: $n keys" >&2
    "$ctl" --endpoints "$endpoints" bench put --key-prefix bench-keys/ --sequential --total "$n" --key-space "$n" \
      --clients 64 --conns 8 --value-size 256 >/dev/null
    sleep 2
    after=$(rss_kib)
    row="{\"system\":\"$kind\",\"keys\":$n,\"rss_bytes_per_key_per_member\":$(((after - before) * 1024 / n / members))"
    row+=",\"range\":$("$ctl" --endpoints "$endpoints" -w json bench range --driver etcd-client --key-prefix bench-keys/ \
      --key-space "$n" --range-limit 1000 --clients 4 --conns 2 --total $((1000 / scale)))"
    row+=",\"count\":$("$ctl" --endpoints "$endpoints" -w json bench count --driver etcd-client --key-prefix bench-keys/ \
      --key-space "$n" --clients 1 --conns 1 --total $((200 / scale)))"
    echo "$row}" | tee -a "$work/keys.jsonl" >&2
    stop_all
  done
}

if [ "${1:-}" = keys ]; then
  for run in $(seq "${ROUNDS:-1}"); do
    for kind in etcd raftlock; do many_keys "$kind"; done
  done
  python3 scripts/bench-scale.py "$work" keys
  exit 0
fi

if [ "${1:-}" = scale ]; then
  sizes=${SCALE_N:-1000 10000 100000}
  small=$(for n in $sizes; do if [ "$n" -le 10000 ]; then echo "$n"; fi; done | xargs)
  # Each workload's time, in .bench/scale-times.txt: where a run's hour goes.
  timed() { local t=$SECONDS; "$@"; echo "run $run: $* took $((SECONDS - t)) s" | tee -a "$work/scale-times.txt" >&2; }
  for run in $(seq "${ROUNDS:-1}"); do
    for kind in etcd raftlock; do
      HELD_LOCKS=$sizes timed held "$kind"
      QUEUE_LENGTHS="10 $sizes" timed queue "$kind"
      WATCHERS=$small timed watchers "$kind"
      KEYS=$sizes timed many_keys "$kind"
    done
    for n in $sizes; do timed storm etcd "$run" "$n"; timed storm raftlock "$run" "$n"; done
  done
  python3 scripts/bench-scale.py "$work" held queue storm watchers keys | tee "$work/scale.txt"
  plotter=$bin/bench-plot
  [ -x "$plotter" ] || plotter=$(BIN_DIR='' scripts/release-bins.sh)/bench-plot
  "$plotter" --scale "$work/scale.jsonl" "$work/scale.svg" \
    "How cost grows: raftlock and etcd 3.5.1, 3 members on one $(nproc)-core machine ($(date -u +%Y-%m-%d))"
  echo "tables: $work/scale.txt, picture: $work/scale.svg" >&2
  exit 0
fi

if [ "${1:-}" = held ]; then
  for run in $(seq "${ROUNDS:-1}"); do
    for kind in ${HELD_SYSTEMS:-etcd raftlock}; do held "$kind"; done
  done
  python3 - "$work/held.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'system':<9} {'held':>7} {'RSS B/lock/member':>17} {'lock p50 ms':>11} {'p99 ms':>7} {'native p50 ms':>13} {'p99 ms':>7} {'List 1,000 ms':>13} {'List all ms':>11} {'listed':>7} {'queue List ms':>13} {'Describe ms':>11} {'indexed ms':>10}")
for r in sorted(rows, key=lambda r: (r["held"], r["system"])):
    l, n = r["lock"], r.get("native-lock")
    native = f"{n['p50_ms']:>13.2f} {n['p99_ms']:>7.2f}" if n else f"{'-':>13} {'-':>7}"
    lists = f"{r['list_page_ms']:>13.1f} {r['list_all_ms']:>11.1f} {r['listed']:>7}" if "listed" in r else f"{'-':>13} {'-':>11} {'-':>7}"
    queue = f"{r['queue_list_ms']:>13} {r['queue_describe_ms']:>11} {r['queue_describe_indexed_ms']:>10}" if "queue_list_ms" in r else f"{'-':>13} {'-':>11} {'-':>10}"
    print(f"{r['system']:<9} {r['held']:>7} {r['rss_bytes_per_lock_per_member']:>17} {l['p50_ms']:>11.2f} {l['p99_ms']:>7.2f} {native} {lists} {queue}")
PY
  exit 0
fi

if [ "${1:-}" = watchers ]; then
  for run in $(seq "${ROUNDS:-1}"); do
    for kind in ${WATCHERS_SYSTEMS:-etcd raftlock}; do watchers "$kind"; done
  done
  python3 - "$work/watchers.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'system':<9} {'watchers':>8} {'shape':<9} {'puts':>5} {'sent->last p50 ms':>17} {'p99 ms':>7} {'answer->last p50 ms':>19} {'p99 ms':>7} {'CPU us/event':>12}")
for r in sorted(rows, key=lambda r: (r["watchers"], r["shape"], r["system"])):
    if r.get("failed"):
        print(f"{r['system']:<9} {r['watchers']:>8} {r['shape']:<9} failed (see the log above)")
        continue
    b = r["r"]
    per_put = r["watchers"] if r["shape"] == "one-key" else 1
    cpu = (b.get("server_cpu_us_per_op") or 0) / per_put
    a50, a99 = b.get("after_answer_ms", [0, 0])
    print(f"{r['system']:<9} {r['watchers']:>8} {r['shape']:<9} {b['total']:>5} {b['p50_ms']:>17.2f} {b['p99_ms']:>7.2f} {a50:>19.2f} {a99:>7.2f} {cpu:>12.1f}")
PY
  exit 0
fi

if [ "${1:-}" = queue ]; then
  for run in $(seq "${ROUNDS:-1}"); do
    for kind in ${QUEUE_SYSTEMS:-etcd raftlock}; do queue "$kind"; done
  done
  python3 - "$work/queue.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'system':<9} {'workload':<12} {'queue':>6} {'handoffs/s':>10} {'ms/handoff':>10} {'handoff p50':>11} {'handoff p99':>11} {'cycle p50 ms':>12} {'cycle p99 ms':>12} {'CPU us/handoff':>14} {'errors':>6}")
for r in sorted(rows, key=lambda r: (r["workload"], r["queue"], r["system"])):
    if r.get("stalled"):
        print(f"{r['system']:<9} {r['workload']:<12} {r['queue']:>6} stalled: failed requests, none succeeding for QUEUE_STALL_AFTER s, or no end in time (the log says which)")
        continue
    b = r["r"]
    w = r["workload"] + (f"/{r['permits']}" if r.get("permits", 1) > 1 else "")
    h50, h99 = b.get("handoff_ms") or (float("nan"), float("nan"))
    print(f"{r['system']:<9} {w:<12} {r['queue']:>6} {b['ops_per_sec']:>10.0f} {1e3 / max(b['ops_per_sec'], 1e-9):>10.2f}"
          f" {h50:>11.2f} {h99:>11.2f} {b['p50_ms']:>12.1f} {b['p99_ms']:>12.1f} {b.get('server_cpu_us_per_op', 0):>14.0f} {b['errors']:>6}")
PY
  exit 0
fi

if [ "${1:-}" = storm ]; then
  # STORM_RATES: raftlock's --lease-expiry-rate values to run (default: its default).
  for run in $(seq "${ROUNDS:-3}"); do
    storm etcd "$run"
    for rate in ${STORM_RATES:-default}; do
      raftlock_args=(); [ "$rate" = default ] || raftlock_args=(--lease-expiry-rate "$rate")
      storm_label="raftlock${raftlock_args[*]:+ ${raftlock_args[*]}}"
      storm raftlock "$run"
    done
  done
  python3 - "$work/storm.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'system':<36} {'run':>3} {'leases':>7} {'all gone after s':>17} {'elections':>9} {'leader CPU s':>12} {'puts/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'errors':>6}")
for r in sorted(rows, key=lambda r: (r["system"], r["run"])):
    b = r["r"]
    gone = "never" if r["gone_after_s"] is None else f"{r['gone_after_s']:.1f}"
    print(f"{r['system']:<36} {r['run']:>3} {r['leases']:>7} {gone:>17} {r['elections']:>9} {r['leader_cpu_s']:>12}"
          f" {b['ops_per_sec']:>7.0f} {b['p50_ms']:>7.2f} {b['p99_ms']:>7.2f} {b['max_ms']:>7.1f} {b['errors']:>6}")
PY
  exit 0
fi

if [ "${1:-}" = failover ]; then
  failover etcd
  failover raftlock
  python3 - "$work/failover.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'signal':<7} {'op':<4} {'client on':<10} {'system':<9} {'rounds':>6} {'median gap ms':>14} {'worst gap ms':>13}  every round")
keys = sorted({(r["signal"], r["op"], r["client"], r["system"]) for r in rows}, key=lambda k: (k[0] != "KILL", k[1] != "put", k[2], k[3]))
for sig, op, client, system in keys:
    gaps = [r["gap_ms"] for r in rows if (r["signal"], r["op"], r["client"], r["system"]) == (sig, op, client, system)]
    print(f"{sig:<7} {op:<4} {client:<10} {system:<9} {len(gaps):>6} {statistics.median(gaps):>14.0f} {max(gaps):>13.0f}  "
          + " ".join(f"{g:.0f}" for g in gaps))
PY
  exit 0
fi

if [ "${1:-}" = stall ]; then
  stall etcd
  stall raftlock
  python3 - "$work/stall.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'event':<16} {'system':<9} {'event s':>8} {'elections':>9} {'puts/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>6}")
for r in sorted(rows, key=lambda r: (r["event"], r["system"])):
    b = r["r"]
    print(f"{r['event']:<16} {r['system']:<9} {r['event_seconds']:>8.2f} {r['elections']:>9} {b['ops_per_sec']:>8.0f}"
          f" {b['p50_ms']:>8.2f} {b['p99_ms']:>8.2f} {b['max_ms']:>8.1f} {b['errors']:>6}")
PY
  exit 0
fi

if [ "${1:-}" = observers ]; then
  # Lock handoffs (16 clients on one native lock) with no lock-event
  # streams, then with 1,000 (Observe on the same lock, spread over the
  # members, each reading every event), alternating, ROUNDS times (default 3).
  # Then the same at a fixed pace (RATE handoffs/s, default 50): the
  # latency of a handoff when the lock is not saturated.
  start_cluster raftlock 24790
  for round in $(seq "${ROUNDS:-3}"); do
    for pace in 0 "${RATE:-50}"; do
      for n in 0 1000; do
        total=$((4000 / scale))
        [ "$pace" = 0 ] || total=$((${RATE:-50} * 20 / scale))
        observers=$n apart=
        if [ "${OBSERVERS_APART:-}" ] && [ "$n" != 0 ]; then
          # The observers in a process of their own (as on other machines),
          # at the lowest CPU priority, held open by a second acquire due
          # long after the run (the process is stopped when the run ends).
          nice -n 19 "$ctl" --endpoints "$endpoints" -w json bench native-lock --clients 1 --lock-names 1 \
            --total 2 --rate 0.001 --lock-observers "$n" >/dev/null &
          apart=$!
          observers=0
          # Measure only once all of them are open, as the members count
          # them (Observe calls started and not yet handled).
          for _ in $(seq 300); do
            kill -0 "$apart" 2>/dev/null || { echo "the observers' process ended before the run" >&2; exit 1; }
            open=0
            for e in ${endpoints//,/ }; do
              open=$((open + $(curl -s "$e/metrics" | awk '/^grpc_server_(started|handled)_total\{/ && /grpc_method="Observe"/ && /grpc_service="raftlock.v1.Locks"/ {
                n += ($1 ~ /started/ ? 1 : -1) * $NF } END { printf "%d", n }')))
            done
            [ "$open" -lt "$n" ] || break
            sleep 0.1
          done
          [ "$open" -ge "$n" ] || { echo "only $open of $n observers opened in 30 s" >&2; exit 1; }
        fi
        out=$("$ctl" --endpoints "$endpoints" -w json bench native-lock --clients 16 --conns 4 --lock-names 1 \
          --total "$total" --lock-observers $observers --rate "$pace" --server-pids "$(IFS=,; echo "${pids[*]}")")
        if [ -n "$apart" ]; then kill "$apart"; wait "$apart" || true; fi
        python3 - "$n" "$out" "$round" "$pace" <<'PY'
import json, sys
r = json.loads(sys.argv[2])
pace = "saturated," if sys.argv[4] == "0" else sys.argv[4] + "/s,"
line = "round %s, %-10s %5d observers: %6.0f handoffs/s  cycle p50 %6.2f ms  p99 %6.2f ms" % (
    sys.argv[3], pace, int(sys.argv[1]), r["ops_per_sec"], r["p50_ms"], r["p99_ms"])
# The members' CPU per handoff.
line += "  members' CPU %5.0f us" % r["server_cpu_us_per_op"]
# A saturated run's handoffs: a release sent to the next grant answered.
if r.get("handoff_ms"):
    line += "  handoff p50 %5.2f ms  p99 %5.2f ms" % tuple(r["handoff_ms"])
print(line)
PY
      done
    done
  done
  exit 0
fi

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
start_cluster etcd 23790; [ "${AUTH:-}" = 1 ] && enable_auth "$endpoints"; suite etcd; sweep etcd; stop_all
user_args=()
echo "== raftlock, 3 members" >&2
start_cluster raftlock 24790; [ "${AUTH:-}" = 1 ] && enable_auth "$endpoints"; suite raftlock; sweep raftlock
stop_all; user_args=()
members=5
echo "== etcd 3.5.1, 5 members" >&2
rm -rf "$work"/etcd-n*
start_cluster etcd 23790; [ "${AUTH:-}" = 1 ] && enable_auth "$endpoints"; suite_five etcd; stop_all; user_args=()
echo "== raftlock, 5 members" >&2
rm -rf "$work"/raftlock-n*
start_cluster raftlock 24790; [ "${AUTH:-}" = 1 ] && enable_auth "$endpoints"; suite_five raftlock; stop_all
members=3

{
[ "$scheme" = https ] && echo "TLS: client and peer ports with certificates required (mTLS), both systems"
[ "${AUTH:-}" = 1 ] && echo "AUTH: etcd auth on, simple tokens, the client a non-root user with a prefix permission, both systems"
python3 - "$work/results.jsonl" "$work/sweep.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["args"], {})[r["system"]] = dict(r["r"], steal=r.get("steal_pct", 0.0), elections=r.get("elections", 0))
print(f"{'workload':<84} {'etcd ops/s':>10} {'raftlock':>10} {'ratio':>6}   {'etcd p50':>9} {'raftlock':>9}   {'etcd p99':>9} {'raftlock':>9}   {'steal % (etcd/raftlock)':>23}   {'elections':>9}")
for args, s in by.items():
    e, r = s.get("etcd"), s.get("raftlock")
    if not r: continue
    if not e:  # raftlock only (its native API): compare with etcd's Lock service
        e = by.get(args.replace("native-lock", "lock"), {}).get("etcd")
        args += " vs etcd lock"
    if not e: continue
    print(f"{args:<84} {e['ops_per_sec']:>10.0f} {r['ops_per_sec']:>10.0f} {r['ops_per_sec']/e['ops_per_sec']:>5.2f}x"
          f"   {e['p50_ms']:>7.3f}ms {r['p50_ms']:>7.3f}ms   {e['p99_ms']:>7.3f}ms {r['p99_ms']:>7.3f}ms"
          f"   {e['steal']:>11.1f} / {r['steal']:<9.1f}   {e['elections']:>4} / {r['elections']:<4}")
print()
print("CPU per operation (µs): the members' (all of them, user and system) and the client's own; the")
print("two systems' ratio of the totals bounds their throughput ratio when the machine's cores are busy")
print(f"{'workload':<84} {'etcd members':>12} {'raftlock':>9}   {'etcd client':>11} {'raftlock':>9}   {'total ratio':>11}")
for args, s in by.items():
    e, r = s.get("etcd"), s.get("raftlock")
    if not (e and r and "server_cpu_us_per_op" in e and "server_cpu_us_per_op" in r): continue
    em, rm = e["server_cpu_us_per_op"], r["server_cpu_us_per_op"]
    ec, rc = e["client_cpu_us_per_op"], r["client_cpu_us_per_op"]
    print(f"{args:<84} {em:>12.1f} {rm:>9.1f}   {ec:>11.1f} {rc:>9.1f}   {(em + ec) / max(rm + rc, 1e-9):>10.2f}x")
print()
print("The sweep (etcd-client driver, every member): ops/s and p50/p99 ms")
sweep = [json.loads(l) for l in open(sys.argv[2])]
print(f"{'workload':<6} {'clients':>7}   {'etcd ops/s':>10} {'raftlock':>9} {'ratio':>6}   {'etcd p50/p99 ms':>16} {'raftlock p50/p99 ms':>20}")
points = {(p["workload"], p["clients"], p["system"]): p["r"] for p in sweep}
for (w, c) in sorted({(w, c) for (w, c, _) in points}):
    e, r = points.get((w, c, "etcd")), points.get((w, c, "raftlock"))
    if not (e and r): continue
    print(f"{w:<6} {c:>7}   {e['ops_per_sec']:>10.0f} {r['ops_per_sec']:>9.0f} {r['ops_per_sec']/e['ops_per_sec']:>5.2f}x"
          f"   {e['p50_ms']:>7.2f} / {e['p99_ms']:<7.2f} {r['p50_ms']:>9.2f} / {r['p99_ms']:<7.2f}")
PY
} | tee "$work/results.txt"
plotter=$bin/bench-plot
[ -x "$plotter" ] || plotter=$(BIN_DIR='' scripts/release-bins.sh)/bench-plot
"$plotter" "$work/sweep.jsonl" "$work/results.svg" \
  "raftlock and etcd 3.5.1, 3 members on one $(nproc)-core machine, etcd-client driver ($(date -u +%Y-%m-%d))"
echo "tables: $work/results.txt, picture: $work/results.svg" >&2

#!/usr/bin/env python3
"""Tables of scripts/bench.sh's size workloads, and the points of their plot.

    bench-scale.py WORK_DIR WORKLOAD...    (held, queue, storm, watchers, keys)

Reads WORK_DIR/<workload>.jsonl (what bench.sh's held, queue, storm,
watchers and many_keys functions append), prints a table per workload with
both systems side by side for each N, and writes WORK_DIR/scale.jsonl: one
line per measured point, the input of `bench-plot --scale`.

Where a row was measured more than once (ROUNDS > 1), a cell shows the
median and, in brackets, the lowest and highest. A row that failed or
stalled shows why instead of figures, and gives no point to the plot.
"""

import json
import os
import statistics
import sys

work = sys.argv[1]
points = []


def rows(name):
    path = os.path.join(work, f"{name}.jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def cell(values, digits=1):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    m = statistics.median_low(values)
    if len(values) == 1:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def point(panel, unit, x, system, series, n, value):
    if value is not None:
        points.append(dict(panel=panel, unit=unit, x=x, system=system, series=series, n=n, value=value))


def table(header, lines):
    widths = [max(len(str(r[i])) for r in [header] + lines) for i in range(len(header))]
    for r in [header] + lines:
        print("  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    print()


def by(rs, *keys):
    groups = {}
    for r in rs:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    return groups


def held():
    rs = rows("held")
    print("Held locks: N locks held, each on its own lease; Lock+Unlock on 64 other names (16 clients)")
    lines = []
    for (n, system), g in sorted(by(rs, "held", "system").items()):
        rss = [r["rss_bytes_per_lock_per_member"] for r in g]
        lock = [r["lock"] for r in g]
        native = [r["native-lock"] for r in g if "native-lock" in r]
        lines.append([system, n, cell(rss, 0), cell([b["p50_ms"] for b in lock]), cell([b["p99_ms"] for b in lock]),
                      cell([b["p99_ms"] for b in native]), cell([r.get("list_page_ms") for r in g], 0),
                      cell([r.get("list_all_ms") for r in g], 0), cell([r.get("queue_list_ms") for r in g], 0),
                      cell([r.get("queue_describe_ms") for r in g], 0),
                      cell([r.get("queue_describe_indexed_ms") for r in g], 0),
                      cell([r.get("queue_describe_leader_ms") for r in g], 0),
                      cell([r.get("queue_describe_follower_ms") for r in g], 0)])
        for r in g:
            point("Held locks: memory per lock per member", "bytes", "locks held", system, "RSS", n,
                  r["rss_bytes_per_lock_per_member"])
            for series in ("p50", "p99"):
                point("Held locks: Lock+Unlock of another name", "ms", "locks held", system, series, n,
                      r["lock"][f"{series}_ms"])
                if "native-lock" in r:
                    point("Held locks: Lock+Unlock of another name", "ms", "locks held", "raftlock native", series,
                          n, r["native-lock"][f"{series}_ms"])
    table(["system", "held", "RSS B/lock/member", "Lock p50 ms", "Lock p99 ms", "native p99 ms", "List 1,000 ms",
           "List all ms", "queue of N: List ms", "Describe 1,000 ms", "indexed ms", "leader ms",
           "follower ms"], lines)


def queue():
    rs = rows("queue")
    print("Queues: N clients take turns on one lock (N-1 wait); mean time per handoff, a handoff's p50 and p99 (a release"
          " sent to the next grant answered), a client's wait p99, CPU")
    lines = []
    for (workload, n, system), g in sorted(by(rs, "workload", "queue", "system").items()):
        done = [r["r"] for r in g if not r.get("stalled")]
        if not done:
            lines.append([system, workload, n, "stalled", "", "", "", "", ""])
            continue
        per = [1e3 / max(b["ops_per_sec"], 1e-9) for b in done]
        handoff = [b.get("handoff_ms") for b in done]
        lines.append([system, workload, n, cell(per, 2), cell([h and h[0] for h in handoff], 2),
                      cell([h and h[1] for h in handoff], 2), cell([b["p99_ms"] for b in done], 0),
                      cell([b.get("server_cpu_us_per_op") for b in done], 0), sum(b["errors"] for b in done)])
        label = "raftlock native" if workload == "native-lock" else system
        for v in per:
            point("Queue: time per handoff", "ms", "clients in the queue", label, "mean", n, v)
    table(["system", "workload", "queue", "ms/handoff", "handoff p50 ms", "handoff p99 ms", "wait p99 ms",
           "CPU us/handoff", "errors"], lines)


def storm():
    rs = rows("storm")
    print("Lease-expiry storms: N leases with a key each lapse at once while 16 clients put")
    lines = []
    for (n, system), g in sorted(by(rs, "n", "system").items()):
        gone = [r["gone_after_s"] for r in g]
        puts = [r["r"] for r in g]
        lines.append([system, n, cell(gone), cell([r["elections"] for r in g], 0), cell([b["p99_ms"] for b in puts]),
                      cell([b["max_ms"] for b in puts]), cell([r["leader_cpu_s"] for r in g])])
        for r in g:
            point("Lease-expiry storm: until every key is gone", "seconds", "leases lapsing at once", system, "gone",
                  n, r["gone_after_s"])
            point("Lease-expiry storm: puts meanwhile", "ms", "leases lapsing at once", system, "p99", n,
                  r["r"]["p99_ms"])
            point("Lease-expiry storm: puts meanwhile", "ms", "leases lapsing at once", system, "max", n,
                  r["r"]["max_ms"])
    table(["system", "leases", "all gone after s", "elections", "put p99 ms", "put max ms", "leader CPU s"], lines)


def watchers():
    rs = rows("watchers")
    print("Watchers: a put's answer to the last event it causes (one-key: every watcher; others: one)")
    lines = []
    for (shape, n, system), g in sorted(by(rs, "shape", "watchers", "system").items()):
        done = [r["r"] for r in g if not r.get("failed")]
        if not done:
            lines.append([system, shape, n, "failed", "", ""])
            continue
        after = [b.get("after_answer_ms", [0, 0]) for b in done]
        per_put = n if shape == "one-key" else 1
        cpu = [(b.get("server_cpu_us_per_op") or 0) / per_put for b in done]
        lines.append([system, shape, n, cell([a[1] for a in after], 2), cell([b["p99_ms"] for b in done], 2),
                      cell(cpu, 1)])
        if shape == "one-key":
            for a, b in zip(after, done):
                point("Watchers of one key: a put to its last event", "ms", "watchers", system, "p99 from answer",
                      n, a[1])
                point("Watchers of one key: a put to its last event", "ms", "watchers", system, "p99 from sending",
                      n, b["p99_ms"])
    table(["system", "shape", "watchers", "answer->last p99 ms", "sent->last p99 ms", "CPU us/event"], lines)


def keys():
    rs = rows("keys")
    print("Keys: N keys of 256 bytes; a range of 1,000 keys (4 clients), a count-only range over all (1 client)")
    lines = []
    for (n, system), g in sorted(by(rs, "keys", "system").items()):
        lines.append([system, n, cell([r["rss_bytes_per_key_per_member"] for r in g], 0),
                      cell([r["range"]["p50_ms"] for r in g], 2), cell([r["range"]["p99_ms"] for r in g], 2),
                      cell([r["count"]["p50_ms"] for r in g], 2), cell([r["count"]["p99_ms"] for r in g], 2)])
        for r in g:
            point("Keys: memory per key per member", "bytes", "keys", system, "RSS", n,
                  r["rss_bytes_per_key_per_member"])
            for series in ("p50", "p99"):
                point("Keys: a range of 1,000 keys", "ms", "keys", system, series, n, r["range"][f"{series}_ms"])
                point("Keys: a count-only range over all", "ms", "keys", system, series, n,
                      r["count"][f"{series}_ms"])
    table(["system", "keys", "RSS B/key/member", "range p50 ms", "range p99 ms", "count p50 ms", "count p99 ms"],
          lines)


workloads = {"held": held, "queue": queue, "storm": storm, "watchers": watchers, "keys": keys}
for name in sys.argv[2:]:
    workloads[name]()
with open(os.path.join(work, "scale.jsonl"), "w") as out:
    for p in points:
        out.write(json.dumps(p) + "\n")

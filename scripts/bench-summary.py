#!/usr/bin/env python3
"""Merges several runs of scripts/bench.sh into the README's tables.

    scripts/bench-summary.py RUN_DIR...

Each RUN_DIR is a copy of one run's .bench directory (results.jsonl, and
sweep.jsonl if the run swept). Prints, as Markdown:
- throughput: each row's ops/s in every run for both systems (a single
  client's put with its p50), and raftlock's over etcd's, the median of the
  runs' ratios and each run's;
- CPU: the members' and the client's CPU per operation (the range over the
  runs) and the median ratios of total CPU and of throughput;
- the sweep: ops/s per point in every run, the median ratio, and the p50/p99
  of the run with the median throughput;
- the runs' largest steal share and the elections any row saw.
Rows only one system ran (raftlock's native locks) are left out. A row is
the same in two runs when its arguments are, so runs of one bench.sh
version merge, and runs of different versions keep their rows apart.
"""

import json
import statistics
import sys
from pathlib import Path


def load(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def label(args, driver):
    """The README's name for a row, from the bench arguments."""
    words = args.split()
    opt = {words[i]: words[i + 1] for i in range(len(words) - 1) if words[i].startswith("--")}
    workload, clients = words[0], int(opt.get("--clients", "1"))
    many = f"{clients} client{'s' if clients != 1 else ''}"
    if workload == "lock":
        name = "lock handoff, 16 clients, one lock" if opt.get("--lock-names") == "1" and clients > 1 else (
            "lock+unlock, 1 client" if clients == 1 else f"lock+unlock, {many}, distinct locks")
        # raftlockctl's lock rows go to the leader only.
        if driver == "raftlockctl" and "(5 members)" not in args:
            name += " (leader)"
    elif workload == "put" and opt.get("--value-size") == "1024":
        name = f"put 1 KiB, {many}"
    else:
        name = f"{workload}, {many}"
    if "(leader)" in args:
        name += ", on the leader (p50 ms)"
    elif "(follower)" in args:
        name += ", on a follower (p50 ms)"
    if driver == "etcd-client" and opt.get("--conns") == "1" and clients > 1:
        name += ", one shared client"
    if "(5 members)" in args:
        name = "5 members: " + name
    return name


def fmt(n):
    return f"{n:,.0f}"


def ratio(xs):
    return f"{statistics.median(xs):.2f}x ({', '.join(f'{x:.2f}' for x in xs)})"


def main(dirs):
    runs = [load(Path(d) / "results.jsonl") for d in dirs]
    rows = {}  # (driver, args) -> {"etcd": [r per run], "raftlock": [...]}
    order = []
    steal, elections = 0.0, 0
    for n, run in enumerate(runs):
        for rec in run:
            steal = max(steal, rec.get("steal_pct", 0.0))
            elections += rec.get("elections", 0)
            key = (rec["r"]["driver"], rec["args"])
            if key not in rows:
                rows[key] = {"etcd": [None] * len(runs), "raftlock": [None] * len(runs)}
                order.append(key)
            rows[key][rec["system"]][n] = rec["r"]
    both = [k for k in order if all(rows[k]["etcd"]) and all(rows[k]["raftlock"])]

    print("| client | workload | etcd 3.5.1 (runs) | raftlock (runs) | raftlock/etcd, median (runs) |")
    print("|---|---|---|---|---:|")
    for k in both:
        e, r = rows[k]["etcd"], rows[k]["raftlock"]
        single = "(leader)" in k[1] or "(follower)" in k[1]
        cell = lambda x: fmt(x["ops_per_sec"]) + (f" ({x['p50_ms']:.2f})" if single else "")
        ratios = [b["ops_per_sec"] / a["ops_per_sec"] for a, b in zip(e, r)]
        print(f"| {k[0]} | {label(k[1], k[0])} | {' / '.join(map(cell, e))} | {' / '.join(map(cell, r))} | {ratio(ratios)} |")

    print()
    print("| client | workload | members, etcd (µs/op) | members, raftlock | client vs etcd | client vs raftlock "
          "| CPU ratio, median | throughput ratio, median |")
    print("|---|---|---|---|---|---|---:|---:|")
    span = lambda xs: f"{min(xs):.0f}-{max(xs):.0f}"
    for k in both:
        e, r = rows[k]["etcd"], rows[k]["raftlock"]
        if any("server_cpu_us_per_op" not in x for x in e + r):
            continue
        cpu = [(a["server_cpu_us_per_op"] + a["client_cpu_us_per_op"]) / (b["server_cpu_us_per_op"] + b["client_cpu_us_per_op"])
               for a, b in zip(e, r)]
        thr = [b["ops_per_sec"] / a["ops_per_sec"] for a, b in zip(e, r)]
        name = label(k[1], k[0]).replace(" (p50 ms)", "")
        print(f"| {k[0]} | {name} | {span([x['server_cpu_us_per_op'] for x in e])} "
              f"| {span([x['server_cpu_us_per_op'] for x in r])} | {span([x['client_cpu_us_per_op'] for x in e])} "
              f"| {span([x['client_cpu_us_per_op'] for x in r])} | {statistics.median(cpu):.2f}x | {statistics.median(thr):.2f}x |")

    sweeps = [load(Path(d) / "sweep.jsonl") for d in dirs]
    points = {}
    for n, run in enumerate(sweeps):
        for rec in run:
            points.setdefault((rec["workload"], rec["clients"]), {"etcd": {}, "raftlock": {}})[rec["system"]][n] = rec["r"]
    complete = sorted(k for k, v in points.items() if len(v["etcd"]) == len(v["raftlock"]) == len(dirs))
    if complete:
        print()
        print("| workload | clients | etcd ops/s (runs) | raftlock ops/s (runs) | median ratio | p50 ms etcd / raftlock "
              "| p99 ms etcd / raftlock |")
        print("|---|---:|---|---|---:|---|---|")
        for k in complete:
            e = [points[k]["etcd"][n] for n in range(len(dirs))]
            r = [points[k]["raftlock"][n] for n in range(len(dirs))]
            mid = lambda xs: sorted(xs, key=lambda x: x["ops_per_sec"])[len(xs) // 2]
            ratios = [b["ops_per_sec"] / a["ops_per_sec"] for a, b in zip(e, r)]
            me, mr = mid(e), mid(r)
            print(f"| {k[0]} | {k[1]} | {' / '.join(fmt(x['ops_per_sec']) for x in e)} "
                  f"| {' / '.join(fmt(x['ops_per_sec']) for x in r)} | {statistics.median(ratios):.2f}x "
                  f"| {me['p50_ms']:.2f} / {mr['p50_ms']:.2f} | {me['p99_ms']:.1f} / {mr['p99_ms']:.1f} |")

    print()
    print(f"{len(dirs)} runs; steal at most {steal}%; elections during rows: {elections}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])

#!/usr/bin/env python3
"""Sampling overhead of finished runs, from their samples.jsonl: the median quiescent sample's
probe cost (cost_us) over the median iteration, and all probe costs over the run's wall time.

    python3 scripts/overhead.py RUN_DIR...
"""
import json
import statistics
import sys


def overhead(run_dir):
    with open(f"{run_dir}/samples.jsonl") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    header, rows = lines[0], lines[1:]
    quiescent = [r for r in rows if r.get("quiescent")]
    cost_s = lambda r: sum(r.get("cost_us", {}).values()) / 1e6
    iteration_s = [b["t"] - a["t"] for a, b in zip(quiescent, quiescent[1:]) if b["iter"] == a["iter"] + 1]
    if not iteration_s:
        raise SystemExit(f"{run_dir}: fewer than two consecutive quiescent points")
    median_iter = statistics.median(iteration_s)
    median_sample = statistics.median(cost_s(r) for r in quiescent)
    wall = rows[-1]["t"] - rows[0]["t"]
    return (header.get("scenario", run_dir), median_iter, median_sample, sum(map(cost_s, rows)) / wall)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print(f"{'scenario':18s} {'iteration':>10s} {'sample':>8s} {'ratio':>6s} {'all/wall':>8s}")
    for d in sys.argv[1:]:
        name, it, sample, share = overhead(d)
        print(f"{name:18s} {it*1e3:8.2f}ms {sample*1e6:6.0f}us {100*sample/it:5.2f}% {100*share:7.2f}%")

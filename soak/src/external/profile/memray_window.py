"""What a Python server allocated inside a profiled replay's window and still held at its end,
by stack, read from memray captures through memray's own API.

usage: python3 memray_window.py START_MS MID_MS END_MS CAPTURE...

START_MS, MID_MS and END_MS are wall-clock times (milliseconds since the epoch) of the replay's
quiescent points: the end of warm-up, the middle and the end of the window. For every allocation
stack it prints the bytes and objects allocated after START and alive at END, split into the
halves before and after MID (growth that is the leak's comes in both halves; memory alive at one
point and not at another does not). One JSON object on standard output.
"""
import json
import sys
import sysconfig

import memray


def snapshot_index(times, t_ms):
    """The last snapshot taken at or before t_ms (0 when none is)."""
    k = 0
    for i, t in enumerate(times):
        if t <= t_ms:
            k = i
        else:
            break
    return k


def main():
    start_ms, mid_ms, end_ms = (int(a) for a in sys.argv[1:4])
    stacks = {}
    snapshots = 0
    for path in sys.argv[4:]:
        reader = memray.FileReader(path)
        times = [s.time for s in reader.get_memory_snapshots()]
        snapshots += len(times)
        if not times:
            continue
        i0, im, i1 = (snapshot_index(times, t) for t in (start_ms, mid_ms, end_ms))
        for rec in reader.get_temporal_allocation_records(merge_threads=True):
            halves = [0, 0, 0, 0]  # bytes, objects before MID; bytes, objects after
            for iv in rec.intervals:
                a, d = iv.allocated_before_snapshot, iv.deallocated_before_snapshot
                if a <= i0 or a > i1 or (d is not None and d <= i1):
                    continue
                h = 0 if a <= im else 2
                halves[h] += iv.n_bytes
                halves[h + 1] += iv.n_allocations
            if not any(halves):
                continue
            key = tuple((f, fn, ln) for f, fn, ln in rec.stack_trace())
            acc = stacks.setdefault(key, [0, 0, 0, 0])
            for j in range(4):
                acc[j] += halves[j]
    top = sorted(stacks.items(), key=lambda kv: -(kv[1][0] + kv[1][2]))[:200]
    out = {
        "stdlib": sysconfig.get_paths()["stdlib"],
        "snapshots": snapshots,
        "stacks": [
            {
                "frames": [{"function": f, "file": fn, "line": ln} for f, fn, ln in key],
                "bytes_first_half": v[0],
                "objects_first_half": v[1],
                "bytes_second_half": v[2],
                "objects_second_half": v[3],
            }
            for key, v in top
        ],
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

"""How much more a Python server held at the end of a profiled replay's window than at its start,
by stack, read from memray captures (recording from the server's start) through memray's own API.

usage: python3 memray_window.py START_MS MID_MS END_MS CAPTURE...

START_MS, MID_MS and END_MS are wall-clock times (milliseconds since the epoch) of the replay's
quiescent points at the window's start, middle and end. For every allocation stack it prints the
change of what that stack held alive from START to MID and from MID to END, in bytes and objects:
memory allocated before the window and freed inside it counts against its stack (a cache that
evicts as it adds holds as much at the end as at the start), and growth that is the leak's comes in
both halves. One JSON object on standard output.
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

        def alive(a, d, i):
            """Allocated before snapshot i and not freed before it."""
            return a <= i and (d is None or d > i)

        for rec in reader.get_temporal_allocation_records(merge_threads=True):
            halves = [0, 0, 0, 0]  # change of bytes, objects from START to MID; from MID to END
            for iv in rec.intervals:
                a, d = iv.allocated_before_snapshot, iv.deallocated_before_snapshot
                at = [alive(a, d, i) for i in (i0, im, i1)]
                for h, (before, after) in ((0, (at[0], at[1])), (2, (at[1], at[2]))):
                    delta = int(after) - int(before)
                    halves[h] += delta * iv.n_bytes
                    halves[h + 1] += delta * iv.n_allocations
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
        # The whole live heap's change over the window, every stack counted (the list is the top).
        "net_bytes": sum(v[0] + v[2] for v in stacks.values()),
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

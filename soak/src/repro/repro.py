#!/usr/bin/env python3
"""Reproduces memory growth that plateau found in a server, with Python's standard library alone.

It sends the requests of the run that found it (requests.jsonl.gz beside this script: the same
bodies, iteration by iteration, each completed, or closed early as the run closed it), waits for
each iteration's requests to end, and reads the resident memory (RSS) of the server's process and
of every process under it from /proc. After a warm-up (the run's share of its length), it fits a
line through each process's RSS against the requests sent, and prints the growth per request.

    python3 repro.py --url http://127.0.0.1:8000 --pid SERVER_PID [--requests N] [--timeout-s S]

Exit 1 when that process grows at least half the run's rate per request over the measured window
and over its last half (the growth is reproduced); 0 when it does not; 2 on bad input, a server
that does not answer, or too few points to judge (send more requests).
"""

import argparse
import concurrent.futures
import gzip
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
# A reproduction judges half the run's rate: what the run measured, give or take the noise of
# RSS pages, is well above it; a server that does not grow is well below it.
SHARE_OF_RUN_RATE = 0.5
# Fewer points after the warm-up than this do not make a line.
MIN_POINTS = 10
# A connection refused or reset before its answer began (a server's listen queue full) is tried
# again, this many times, waiting twice as long each time from BACKOFF_S: as plateau's client does.
RETRIES = 5
BACKOFF_S = 0.25


def read_requests(path):
    """The run's description (the first line) and an iterator over its iterations' requests."""
    f = gzip.open(path, "rt", encoding="utf-8")
    meta = json.loads(f.readline())

    def iterations():
        with f:
            for line in f:
                yield json.loads(line)

    return meta, iterations()


def served_model(url, timeout_s):
    with urllib.request.urlopen(url + "/v1/models", timeout=timeout_s) as r:
        return json.load(r)["data"][0]["id"]


_local = threading.local()


def send(url, req, model, timeout_s):
    """One request, done as the run did it; a connection the server did not take is tried again."""
    wait = BACKOFF_S
    for attempt in range(RETRIES + 1):
        try:
            return send_once(url, req, model, timeout_s)
        except (ConnectionRefusedError, ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected):
            if attempt == RETRIES:
                raise
            time.sleep(wait)
            wait *= 2


def send_once(url, req, model, timeout_s):
    """One try. Each thread keeps its connection open while the server does (keep-alive, as
    plateau's client does): a new connection per request overflows a small server's listen queue."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        u = urllib.parse.urlsplit(url)
        conn = _local.conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout_s)
    keep = False
    try:
        body = json.dumps(req["body"]).replace('"{model}"', json.dumps(model)).encode()
        conn.request("POST", req["path"], body, {"Content-Type": "application/json"})
        if req["action"] == "close_before_first_token":
            time.sleep(req.get("after_ms", 1) / 1000.0)
            return
        resp = conn.getresponse()
        if req["action"] == "expect_refusal":
            resp.read()
            keep = not resp.will_close
            return
        if resp.status >= 400:
            raise RuntimeError(f"POST {req['path']} answered {resp.status}: {resp.read(300)!r}")
        chunks, stop_at = 0, req.get("chunks") if req["action"] == "close_after_chunks" else None
        for line in resp:
            if line.startswith(b"data:") and not line.startswith(b"data: [DONE]"):
                chunks += 1
                if stop_at is not None and chunks >= stop_at:
                    return
        keep = not resp.will_close
    finally:
        if not keep:
            conn.close()
            _local.conn = None


def tree(root):
    """The pids of `root` and every process under it."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
                parent[int(d)] = int(stat[stat.rindex(")") + 2 :].split()[1])
            except (OSError, ValueError):
                pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(c for c, pp in parent.items() if pp == p)
    return out


def rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def name_of(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def sanitize(s):
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in s)


def role_of(pid, root):
    """A process's role as plateau names it in a metric (`engine_core` of
    `target.engine_core.proc.rss`): vLLM's processes by their titles, others by their names."""
    comm, cmd = name_of(pid), cmdline(pid)
    if comm.startswith("VLLM::"):
        rest = comm[len("VLLM::") :]
        for prefix, role in (("EngineCor", "engine_core"), ("Worker", "worker"), ("APIServer", "api_server")):
            if rest.startswith(prefix):
                return role
        return sanitize("".join(("_" + c.lower()) if c.isupper() and i else c.lower() for i, c in enumerate(rest)))
    if "EngineCore" in cmd:
        return "engine_core"
    if "multiprocessing.resource_tracker" in cmd:
        return "resource_tracker"
    if pid == root and "vllm" in cmd and (" serve" in cmd or "entrypoints.openai.api_server" in cmd):
        return "api_server"
    return sanitize(comm)


def slope(xs, ys):
    """Least squares: the rise of y per unit of x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0


def fmt(b):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= size:
            return f"{b / size:.2f} {unit}"
    return f"{b:.0f} B"


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    a.add_argument("--pid", required=True, type=int, help="the server's process (its children are read too)")
    a.add_argument("--requests", type=int, default=None, help="requests to send (default: as many as the run sent)")
    a.add_argument("--timeout-s", type=float, default=300.0, help="stop sending after this long and judge (default 300)")
    a.add_argument("--requests-file", default=os.path.join(HERE, "requests.jsonl.gz"))
    o = a.parse_args()
    if not os.path.exists(f"/proc/{o.pid}"):
        sys.exit(f"repro.py: --pid {o.pid}: no such process")
    meta, iterations = read_requests(o.requests_file)
    run_rate = float(meta["rate_per_request"])
    total = o.requests if o.requests is not None else int(meta["requests"])
    if total <= 0:
        sys.exit("repro.py: --requests must be positive")
    try:
        model = served_model(o.url.rstrip("/"), 60)
    except Exception as e:  # noqa: BLE001 - any failure to reach the server is the same answer
        sys.exit(f"repro.py: {o.url}/v1/models: {e}")
    print(f"repro: {meta['summary']}")
    print(f"repro: the run's growth: {fmt(run_rate)}/request in {meta['gauge']} (process: {meta.get('process', 'target')}); sending up to {total} requests to {o.url} ({model})")
    deadline = time.monotonic() + o.timeout_s
    sent, points, pool = 0, [], concurrent.futures.ThreadPoolExecutor(max_workers=int(meta.get("concurrency", 16)))
    for it in iterations:
        if sent >= total or time.monotonic() > deadline:
            break
        reqs = it["requests"][: total - sent]
        for f in [pool.submit(send, o.url.rstrip("/"), r, model, 300) for r in reqs]:
            f.result()
        sent += len(reqs)
        pids = tree(o.pid)
        points.append((sent, {p: rss_bytes(p) for p in pids}))
    pool.shutdown()
    warm = int(len(points) * float(meta["warmup_share"]))
    judged = points[warm:]
    if len(judged) < MIN_POINTS:
        sys.exit(f"repro.py: {len(judged)} points after the warm-up, fewer than {MIN_POINTS}: give more --requests or --timeout-s")
    xs = [p[0] for p in judged]
    half = len(judged) // 2
    tree_series = [sum(v for v in p[1].values() if v) for p in judged]
    series = {}
    for pid in judged[0][1]:
        ys = [p[1].get(pid) for p in judged]
        if all(y is not None for y in ys):
            series[(pid, role_of(pid, o.pid))] = ys
    # The process that grew in the run is judged (by its role: `engine_core`); the whole tree when
    # the run's gauge was the tree's, or when no process here has that role.
    grown = meta.get("process", "target")
    judged_keys = [k for k in series if k[1] == grown] if grown != "target" else []
    grew = False
    lines = []
    rows = [("process tree (RSS)", tree_series, not judged_keys)]
    rows += [(f"pid {pid} {role}", ys, (pid, role) in judged_keys) for (pid, role), ys in series.items()]
    for label, ys, judge in rows:
        whole, last = slope(xs, ys), slope(xs[half:], ys[half:])
        hit = judge and whole >= SHARE_OF_RUN_RATE * run_rate and last >= SHARE_OF_RUN_RATE * run_rate
        grew = grew or hit
        where = "the whole tree" if not judged_keys else grown
        mark = "  <- grows" if hit else ("" if judge else f"  (not judged: the run grew in {where})")
        lines.append(f"  {label}: {fmt(whole)}/request ({fmt(last)}/request over the last half){mark}")
    print(f"repro: {sent} requests in {len(points)} iterations; growth per request after {warm} iterations of warm-up:")
    print("\n".join(lines))
    if grew:
        print(f"repro: reproduced: at least {fmt(SHARE_OF_RUN_RATE * run_rate)}/request, half the run's {fmt(run_rate)}/request")
        sys.exit(1)
    what = "the process tree" if not judged_keys else grown
    print(f"repro: not reproduced: {what} did not grow {fmt(SHARE_OF_RUN_RATE * run_rate)}/request (half the run's {fmt(run_rate)}/request)")
    sys.exit(0)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("repro.py: interrupted")
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        # Exit 1 means the growth was reproduced: a failure to measure is never that.
        sys.exit(f"repro.py: {type(e).__name__}: {e}")

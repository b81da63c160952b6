"""The live bytes of every allocation site of one Python process, read as its run goes: the reader
side of memray's live mode, run by plateau with the server's own interpreter (memray's reader
must be the tracker's version).

usage: python3 memray_sites.py PORT HOOK

HOOK is plateau's hook module in the process (its sitecustomize.py): what plateau's own requests
allocate there (a stack through the hook) is the harness's, never a site of the server's.

plateau's hook has started memray's tracker inside the process, listening on PORT; this reader
connects (retrying until the tracker listens), then answers one request a line on standard input,
one JSON line each on standard output:
  snap SEQ TIMEOUT_MS  the live bytes by site once the tracker's records reach the hook's marker
                       SEQ (a buffer of 1,000,001 + SEQ bytes the hook allocated at the quiescent
                       point: records arrive in order, so every allocation and free before it is
                       counted); {"sites": [[NAME, DOMAIN, BYTES, OBJECTS, STACK or null], ...]},
                       a site's stack given the first time it is sent; or {"error": ...}
  quit                 the reader disconnects (the tracker in the server stops tracking)

A site is the innermost Python frame (`FILE:LINE FUNCTION`, FILE relative to the top of its
package: the first directory up that is not a package), else, for an allocation no Python code
made (a C library's own thread), the innermost native frame past the allocator and the C library
(`native:SOURCE:LINE FUNCTION`, named by its library in plateau), or where that frame has no
symbol (a stripped library) the thread that allocated (`native:thread NAME`). Its domain is the allocator
layer its bytes are in: `pymalloc` for Python's allocator serving objects of at most 512 bytes,
`malloc` for the C library's malloc (Python's larger objects, native code), `mmap` for mappings.
"""
import json
import os
import sys
import time

import memray

PYMALLOC_LIMIT = 512
MARK_BASE = 1_000_001
ALLOCATOR_FRAMES = (
    "malloc", "calloc", "realloc", "free", "posix_memalign", "aligned_alloc", "memalign", "valloc",
    "pvalloc", "mmap", "operator new", "__libc_", "_int_", "memray::", "intercept::", "PyMem_", "_PyMem_",
    "PyObject_Malloc", "PyObject_Calloc", "PyObject_Realloc", "_PyObject_Malloc", "_PyObject_Calloc",
    "_PyObject_Realloc", "pymalloc_", "_PyMem_Raw", "__gnu_cxx::", "std::allocator", "__memalign", "tcache_",
)
PYMALLOC = {1, 2, 3, 4}
MMAP = {14}
_package_top = {}
_named = {}
_sent = set()


def package_relative(path):
    """`path` from the top of its package: the first directory up with no __init__.py."""
    d = os.path.dirname(path)
    if d not in _package_top:
        top = d
        while os.path.exists(os.path.join(top, "__init__.py")) and os.path.dirname(top) != top:
            top = os.path.dirname(top)
        _package_top[d] = top
    top = _package_top[d]
    return os.path.relpath(path, top) if path.startswith(top + os.sep) else path


def native_name(frames, thread):
    """The first frame past the allocator and the C library; where it has no symbol (a stripped
    library), the thread that allocated (its name where it has one)."""
    for function, source, line in frames:
        if any(function.startswith(p) or p in function for p in ALLOCATOR_FRAMES):
            continue
        if function == "<unknown>":
            return "native:thread %s" % (thread or "?")
        src = os.path.basename(source) if source and source != "<unknown>" else "?"
        return "native:%s:%d %s" % (src, line or 0, function)
    return "native:thread %s" % (thread or "?")


def name_of(rec):
    key = (rec.stack_id, rec.native_stack_id, rec.allocator, rec.thread_name)
    if key in _named:
        return _named[key]
    py = rec.stack_trace(max_stacks=64)
    if any(p in HOOK for _, p, _ in py):
        _named[key] = (None, None)
        return _named[key]
    if py:
        function, path, line = py[0]
        name = "%s:%d %s" % (package_relative(path), line, function)
        stack = ["%s:%d %s" % (package_relative(p), ln, f) for f, p, ln in py[:24]]
    else:
        native = rec.native_stack_trace(max_stacks=24) if has_native else []
        name = native_name(native, rec.thread_name) if native else "(no Python frame, no native trace)"
        stack = ["%s:%d %s" % (os.path.basename(s or "?"), ln or 0, f) for f, s, ln in native]
    _named[key] = (name, stack)
    return _named[key]


def domain_of(rec):
    if rec.allocator in MMAP:
        return "mmap"
    if rec.allocator in PYMALLOC and rec.size <= PYMALLOC_LIMIT * max(rec.n_allocations, 1):
        return "pymalloc"
    return "malloc"


def snap(reader, seq, timeout_ms):
    want = MARK_BASE + seq
    deadline = time.monotonic() + timeout_ms / 1000.0
    while True:
        if not reader.is_active:
            return {"error": "memray's tracker in the process is no longer active"}
        records = list(reader.get_current_snapshot(merge_threads=False))
        mark = next((r for r in records if r.size == want), None)
        if mark is not None:
            break
        if time.monotonic() >= deadline:
            return {"error": "memray's records did not reach the quiescent point's marker within %d ms" % timeout_ms}
        time.sleep(0.002)
    sites = {}
    for r in records:
        if r is mark or r.size <= 0:
            continue
        name, stack = name_of(r)
        if name is None:
            continue
        key = (name, domain_of(r))
        acc = sites.setdefault(key, [0, 0, stack])
        acc[0] += r.size
        acc[1] += r.n_allocations
    out = []
    for (name, domain), (size, n, stack) in sorted(sites.items()):
        first = (name, domain) not in _sent
        _sent.add((name, domain))
        out.append([name, domain, size, n, stack if first else None])
    return {"sites": out}


def main():
    global has_native, HOOK
    HOOK = {sys.argv[2], os.path.realpath(sys.argv[2])} if len(sys.argv) > 2 else set()
    reader = memray.SocketReader(port=int(sys.argv[1]))
    reader.__enter__()
    has_native = reader.has_native_traces
    print(json.dumps({"ok": True, "native": has_native, "pid": reader.pid}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "snap" and len(words) == 3:
            try:
                reply = snap(reader, int(words[1]), int(words[2]))
            except Exception as e:  # an answer, never a dead reader
                reply = {"error": "%s: %s" % (type(e).__name__, e)}
        else:
            reply = {"error": "unknown request %r" % line.strip()}
        print(json.dumps(reply), flush=True)
    reader.__exit__(None, None, None)


has_native = False
HOOK = set()
if __name__ == "__main__":
    main()

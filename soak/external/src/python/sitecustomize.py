# plateau's hook in the Python processes of a server it soaks. plateau puts the folder that holds
# this file first on the server's PYTHONPATH, so every Python process of the server (the one plateau
# starts and those started from it, by fork or by multiprocessing's spawn) imports it at start-up as
# `sitecustomize`.
#
# Lifecycle in one process: at import, a daemon thread binds the Unix socket
# $PLATEAU_PY_SOCKETS/<pid>.sock and blocks in accept() (it costs nothing between requests); a
# forked child binds its own. plateau connects at each quiescent sample; a request is one line and
# the answer one line of JSON:
#   stats              after the interpreter's caches are emptied (its type cache; a full garbage
#                      collection where the program has its collector on),
#                      the layers of this process's memory: what Python's small objects hold in its
#                      blocks (sys._debugmallocstats' "bytes in allocated blocks"), the arenas that
#                      hold those blocks, the C library's malloc in use (Python's larger objects and
#                      native memory alike) and the freed memory malloc keeps; and who the process is.
#   memray-live PORT NATIVE PYALLOC
#                      memray's tracker started here in live mode, listening on PORT for plateau's
#                      reader (memray_sites.py, which reads the live bytes of every allocation
#                      site as the run goes): with native frames (NATIVE 1) and Python's own
#                      allocator traced (PYALLOC 1). The tracker is made on a thread of its own,
#                      since memray waits there until the reader connects
#   memray-live-ready  whether that tracker is tracking yet
#   memray-mark SEQ    a marker allocated at a quiescent point (a buffer of 1,000,001 + SEQ bytes,
#                      replacing the one before): once the reader sees it, every allocation and free
#                      before it has reached the reader
#   memray-stop        the tracker stopped
# At exit the socket file goes. Then the environment's own sitecustomize, if it has one, runs as it
# would have without this one. Nothing here may break the server: every failure is an answer.
import os
import sys


def _plateau_hook():
    sockets = os.environ.get("PLATEAU_PY_SOCKETS")
    if not sockets:
        return
    import ctypes
    import gc
    import json
    import socket
    import threading

    libc = ctypes.CDLL(None)
    state = {"server": None, "tracker": None}

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")]

    class Allocator(ctypes.Structure):
        _fields_ = [(n, ctypes.c_void_p) for n in ("ctx", "malloc", "calloc", "realloc", "free")]

    OBJ_DOMAIN = 2
    get_allocator = ctypes.pythonapi.PyMem_GetAllocator
    get_allocator.argtypes = [ctypes.c_int, ctypes.POINTER(Allocator)]
    get_allocator.restype = None
    set_allocator = ctypes.pythonapi.PyMem_SetAllocator
    set_allocator.argtypes = [ctypes.c_int, ctypes.POINTER(Allocator)]
    set_allocator.restype = None
    # The object allocator as the interpreter started: pymalloc, unless PYTHONMALLOC chose another.
    original_obj = Allocator()
    get_allocator(OBJ_DOMAIN, ctypes.byref(original_obj))

    def pymalloc_text():
        """sys._debugmallocstats() into a memory stream (it writes to a C FILE*), not to stderr.
        Under memray's tracing of Python's allocator (plateau's allocation sites), the object
        allocator is memray's wrapper around pymalloc, and the interpreter prints no pymalloc
        figures for an allocator that is not pymalloc itself: for the call, with the interpreter's
        lock held (no other thread allocates Python objects meanwhile), the allocator the process
        started with is put back, then memray's again. Blocks allocated in between are pymalloc's,
        and memray's wrapper frees them to pymalloc as it frees any block it did not see made."""
        current = Allocator()
        get_allocator(OBJ_DOMAIN, ctypes.byref(current))
        swapped = current.malloc != original_obj.malloc
        if swapped:
            set_allocator(OBJ_DOMAIN, ctypes.byref(original_obj))
        try:
            return debug_malloc_stats()
        finally:
            if swapped:
                set_allocator(OBJ_DOMAIN, ctypes.byref(current))

    def debug_malloc_stats():
        # Plain pointers throughout: ctypes.cast would leave a reference cycle behind at every
        # call, garbage the next sample would count in this process's objects.
        open_memstream = libc.open_memstream
        open_memstream.restype = ctypes.c_void_p
        open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
        libc.fclose.argtypes = [ctypes.c_void_p]
        libc.free.argtypes = [ctypes.c_void_p]
        stats = ctypes.pythonapi._PyObject_DebugMallocStats
        stats.argtypes = [ctypes.c_void_p]
        stats.restype = ctypes.c_int
        buf, size = ctypes.c_void_p(), ctypes.c_size_t()
        fp = open_memstream(ctypes.byref(buf), ctypes.byref(size))
        if not fp:
            return ""
        try:
            stats(fp)
        finally:
            libc.fclose(fp)
        text = ctypes.string_at(buf.value, size.value).decode("ascii", "replace")
        libc.free(buf)
        return text

    def settle():
        """The interpreter's caches emptied before the figures, as plateau flushes its own
        allocator's caches at a quiescent point, so the figures are what the program keeps:
        - the type cache (`sys._clear_type_cache`): 4096 slots indexed by the address of an
          attribute's name, each holding that name, so a name built per request (`http.server`'s
          `'do_' + command`) fills a new slot now and then, ever more slowly, for the whole run:
          a clean `http.server` kept 650 to 700 blocks more without the clearing, and its objects
          rose 148 B an iteration over the last half of 80 iterations of n-sampling;
        - a full garbage collection, where the program has its collector on: cyclic garbage
          promoted to the oldest generation waits for a full collection, which the interpreter
          runs only once that generation has grown by a quarter, and the free lists of tuples,
          lists, dicts and frames keep blocks; floors of rl-rollout's objects rose 58 to 171 B an
          iteration in 3 of 4 runs without it. A program that turned its collector off is left
          as it is: what it cannot collect, it keeps."""
        clear = getattr(sys, "_clear_type_cache", None)
        if clear is not None:
            clear()
        if gc.isenabled():
            gc.collect()

    def stats():
        settle()
        out = {"pid": os.getpid(), "ppid": os.getppid(), "executable": sys.executable, "prefix": sys.prefix,
               "argv": [str(a) for a in sys.argv[:3]], "py_blocks": sys.getallocatedblocks()}
        try:
            import multiprocessing
            process = multiprocessing.current_process()
            out["process_name"] = process.name
            # What a process multiprocessing started runs: its role where its title does not say.
            target = getattr(process, "_target", None)
            if target is not None:
                out["process_target"] = getattr(target, "__qualname__", getattr(target, "__name__", str(target)))
        except Exception:
            pass
        # With PYTHONMALLOC=malloc there is no pymalloc: nothing printed, no figure given.
        text = pymalloc_text()
        for line in text.splitlines():
            key, _, value = line.partition("=")
            value = value.strip().replace(",", "")
            if not value.isdigit():
                continue
            if key.strip() == "# bytes in allocated blocks":
                out["py_object_bytes"] = int(value)
            elif key.strip() == "Total" and "py_arena_bytes" not in out:
                out["py_arena_bytes"] = int(value)
        mallinfo2 = getattr(libc, "mallinfo2", None)
        if mallinfo2 is not None:
            mallinfo2.restype = MallInfo2
            m = mallinfo2()
            # glibc's malloc: in use (sbrk'd chunks handed out plus mmapped ones), and freed chunks
            # it keeps. A process on another malloc reads zeros here: plateau says so.
            out["malloc_in_use_bytes"] = m.uordblks + m.hblkhd
            out["malloc_free_bytes"] = m.fordblks
        return out

    def memray_live(args):
        if state["tracker"] is not None or state.get("starting"):
            return {"error": "memray is already tracking in this process"}
        try:
            port, native, pyalloc = int(args[0]), args[1] == "1", args[2] == "1"
        except (IndexError, ValueError):
            return {"error": "memray-live PORT NATIVE PYALLOC"}
        try:
            import memray
        except ImportError:
            return {"error": "no memray", "executable": sys.executable}
        state["starting"] = True

        def track():
            try:
                tracker = memray.Tracker(destination=memray.SocketDestination(server_port=port, address="127.0.0.1"),
                                         native_traces=native, trace_python_allocators=pyalloc, follow_fork=False,
                                         memory_interval_ms=10)
                tracker.__enter__()
                state["tracker"] = tracker
            except Exception as e:
                state["live_error"] = "%s: %s" % (type(e).__name__, e)
            state["starting"] = False

        threading.Thread(target=track, name="plateau-memray", daemon=True).start()
        return {"ok": True, "executable": sys.executable}

    def memray_live_ready():
        if state.get("live_error"):
            return {"error": state["live_error"]}
        return {"ok": state["tracker"] is not None}

    def memray_mark(seq):
        state["mark"] = None
        state["mark"] = bytearray(1_000_000 + int(seq))
        return {"ok": True}

    def memray_stop():
        tracker, state["tracker"] = state["tracker"], None
        if tracker is None:
            return {"error": "memray is not tracking in this process"}
        tracker.__exit__(None, None, None)
        return {"ok": True}

    def answer(line):
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "stats":
            return stats()
        if cmd == "memray-stop":
            return memray_stop()
        if cmd == "memray-live":
            return memray_live(arg.split())
        if cmd == "memray-live-ready":
            return memray_live_ready()
        if cmd == "memray-mark":
            return memray_mark(arg)
        return {"error": "unknown request %r" % cmd}

    def serve(server):
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            try:
                with conn:
                    conn.settimeout(10)
                    data = b""
                    while not data.endswith(b"\n") and len(data) < 4096:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    try:
                        reply = answer(data.decode("utf-8", "replace"))
                    except Exception as e:  # an answer, never a failure of the server
                        reply = {"error": "%s: %s" % (type(e).__name__, e)}
                    conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError:
                pass

    def start():
        old = state["server"]
        if old is not None:  # a forked child: the parent's socket is the parent's
            try:
                old.close()
            except OSError:
                pass
        state["tracker"] = None
        state["starting"] = False
        state["live_error"] = None
        state["mark"] = None
        path = os.path.join(sockets, "%d.sock" % os.getpid())
        try:
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            if os.path.exists(path):
                os.unlink(path)
            server.bind(path)
            server.listen(8)
        except OSError:
            return
        state["server"] = server
        threading.Thread(target=serve, args=(server,), name="plateau-hook", daemon=True).start()

    def remove():
        server = state["server"]
        if server is not None:
            try:
                os.unlink(server.getsockname())
            except (OSError, TypeError):
                pass

    import atexit
    atexit.register(remove)
    os.register_at_fork(after_in_child=start)
    start()


def _plateau_chain():
    """The environment's own sitecustomize, which this module shadows, runs as it would have."""
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.origin is None or os.path.abspath(spec.origin) == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    _plateau_hook()
except Exception as _e:  # the server runs without the hook; plateau says which processes lack it
    sys.stderr.write("plateau hook: %s: %s\n" % (type(_e).__name__, _e))
_plateau_chain()

# plateau's profiled replay of a Python server: loaded by the interpreter at start-up (this
# folder is put first on PYTHONPATH), it starts memray's tracker in every Python process of the
# server when PLATEAU_MEMRAY_OUT names where the captures go, one capture per process. Without
# memray in the server's environment it leaves a marker file instead, and plateau says how to
# install it. It shadows a sitecustomize module of the environment for this replay only.
import os

_out = os.environ.get("PLATEAU_MEMRAY_OUT")
if _out:
    try:
        import atexit
        import memray
    except ImportError:
        with open(_out + ".no-memray", "w") as _f:
            import sys
            _f.write(sys.executable + "\n")
    else:
        _tracker = memray.Tracker(
            "%s.%d.bin" % (_out, os.getpid()),
            native_traces=os.environ.get("PLATEAU_MEMRAY_NATIVE") == "1",
            trace_python_allocators=True,
            follow_fork=True,
            memory_interval_ms=10,
        )
        _tracker.__enter__()
        # The capture is complete when the interpreter exits normally (plateau stops the server
        # with SIGINT first).
        atexit.register(_tracker.__exit__, None, None, None)

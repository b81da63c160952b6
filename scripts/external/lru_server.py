#!/usr/bin/env python3
"""A small OpenAI-compatible server (stdlib only) with a bounded cache, for the false-alarm sweep.

Every request stores an entry of ENTRY_BYTES under its prompt in an LRU cache capped at CAP
entries; once full, each new prompt evicts the oldest. Nothing is kept past the cap: the server's
memory must plateau, however its allocator fragments under the churn. No /metrics.
    lru_server.py PORT [CAP] [ENTRY_BYTES]      (defaults 1000 and 8192)
"""
import collections
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
CAP = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
ENTRY = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
CACHE = collections.OrderedDict()
SERIAL = [0]


def remember(prompt):
    """Stores a fresh entry under a new key (every request is new), evicting the oldest past CAP."""
    SERIAL[0] += 1
    CACHE[(SERIAL[0], prompt[:64])] = bytearray(ENTRY)
    while len(CACHE) > CAP:
        CACHE.popitem(last=False)


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, code, body):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self.reply(200, b'{"object":"list","data":[{"id":"lru"}]}')
        elif self.path == "/health":
            self.reply(200, b"{}")
        else:
            self.reply(404, b'{"error":{"message":"not found"}}')

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        n, max_tokens = req.get("n", 1), req.get("max_tokens", 4)
        if not isinstance(n, int) or n < 1 or not isinstance(max_tokens, int) or max_tokens < 1:
            return self.reply(400, b'{"error":{"message":"invalid"}}')
        remember(str(req.get("prompt") or req.get("messages")))
        # Streamed as server-sent events, a token per choice per chunk, as the soak's client reads.
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(max_tokens):
                for k in range(n):
                    event = {"choices": [{"index": k, "text": " b", "finish_reason": None}]}
                    self.chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()

# What the tests' stub servers share (each test appends its own handler and serves it): an
# OpenAI-style completions server on the standard library, one thread per connection, that streams
# " a" per token and choice. A test's script is this file followed by its own lines, so a line
# number a verdict names is counted from the top of this file.
import json, os, sys
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler


class Stub(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, code, body, kind="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def body(self):
        return self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}"

    def stream(self, n, max_tokens, left_out=()):
        """Streams `max_tokens` tokens of each of `n` choices, but those in `left_out`."""
        events = b"".join(
            b"data: " + json.dumps({"choices": [{"index": k, "text": " a", "finish_reason": None}]}).encode() + b"\n\n"
            for _ in range(max_tokens) for k in range(n) if k not in left_out) + b"data: [DONE]\n\n"
        self.reply(200, events, "text/event-stream")


def serve(handler):
    """Serves `handler` on 127.0.0.1 at the port the script's first argument names, until killed."""
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), handler).serve_forever()


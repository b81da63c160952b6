#!/usr/bin/env bash
# Checks an HTML report in a real browser (headless Chromium, Debian's `chromium` package; the script
# installs it with apt-get when neither `chromium` nor `chromium-browser` is on PATH, or set CHROMIUM
# to a binary). A report is a static, self-contained page, so the checks are strict:
#   - screenshots at desktop (1280x900) and phone (390x844) width, OUT_DIR/desktop.png and phone.png,
#     each not blank: at least 1% of pixels differ from the most common colour, and more than 3 colours;
#   - no console output at all: one --dump-dom run with --enable-logging=stderr, failing on any
#     CONSOLE line (Chromium 148 logs console.log and console.error alike, as
#     `[pid:tid:MMDD/HHMMSS.us:INFO:CONSOLE:LINE] "text", source: URL (LINE)`, so the level is not
#     there to filter on; CSP blocks and uncaught exceptions come the same way);
#   - a DevTools probe (--remote-debugging-pipe, python3 stdlib) that sees what that log does not:
#     console calls with their level, uncaught exceptions, error and warning log entries (a failed
#     image load is only there: "Failed to load resource: net::ERR_..."), any request that is not
#     file:, data:, blob: or about:, failed loads and broken images, and horizontal overflow
#     (documentElement.scrollWidth > clientWidth) at both widths.
#   bash scripts/report-check.sh REPORT.html [OUT_DIR]
# OUT_DIR defaults to a new temporary folder, kept (its path is printed). Exits 0 when every check
# passes, 1 when one fails, 2 on bad usage or when no browser can be found, installed or started.
set -euo pipefail

usage() { echo "usage: bash scripts/report-check.sh REPORT.html [OUT_DIR]" >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 ]] || usage
[[ $1 == -h || $1 == --help ]] && usage
[[ -f $1 ]] || { echo "report-check: no such file: $1" >&2; exit 2; }
command -v python3 >/dev/null || { echo "report-check: python3 is needed" >&2; exit 2; }
command -v timeout >/dev/null || { echo "report-check: timeout (coreutils) is needed" >&2; exit 2; }

report=$(realpath -- "$1")
url=$(python3 -c 'import pathlib, sys; print(pathlib.Path(sys.argv[1]).as_uri())' "$report")
if [[ $# -ge 2 ]]; then out=$2; mkdir -p -- "$out"; else out=$(mktemp -d "${TMPDIR:-/tmp}/report-check.XXXXXX"); fi
out=$(realpath -- "$out")
work=$(mktemp -d "${TMPDIR:-/tmp}/report-check-work.XXXXXX")
trap 'rm -rf -- "$work"' EXIT

# --- the browser -------------------------------------------------------------------------------
# (`command -v` alone would also print a file on PATH that is not executable.)
find_chromium() {
  local c p
  for c in chromium chromium-browser; do
    p=$(type -P -- "$c") && [[ -x $p ]] && { echo "$p"; return 0; }
  done
  return 1
}
install_chromium() {
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    if ! command -v sudo >/dev/null; then
      echo "report-check: chromium is not installed and this user cannot install it (not root, no sudo);" \
        "install Debian's chromium package (apt-get install chromium) or set CHROMIUM" >&2
      return 1
    fi
    # Without a terminal, sudo must not wait for a password nobody can type.
    if [[ -t 0 ]]; then sudo=(sudo); else sudo=(sudo -n); fi
  fi
  if ! command -v apt-get >/dev/null; then
    echo "report-check: chromium is not installed and there is no apt-get to install it; install" \
      "Chromium and put it on PATH as chromium, or set CHROMIUM" >&2
    return 1
  fi
  echo "report-check: chromium not found; installing it with apt-get (about a minute)..." >&2
  local log=$work/apt.log
  # env after sudo: sudo drops the caller's environment. The package lists may be missing or stale.
  apt_get() { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "$@" >>"$log" 2>&1; }
  if ! apt_get install -y chromium; then
    apt_get update || true
    if ! apt_get install -y chromium; then
      tail -n 5 "$log" >&2
      echo "report-check: could not install chromium with apt-get${sudo:+ (${sudo[*]})}" >&2
      return 1
    fi
  fi
}
if [[ -n ${CHROMIUM:-} ]]; then
  if ! chrome=$(type -P -- "$CHROMIUM") || [[ ! -x $chrome ]]; then
    echo "report-check: CHROMIUM=$CHROMIUM is not an executable" >&2; exit 2
  fi
elif ! chrome=$(find_chromium); then
  install_chromium || exit 2
  chrome=$(find_chromium) || { echo "report-check: chromium installed but not on PATH" >&2; exit 2; }
fi

# chrome NAME ARGS...: one headless run with its own throwaway profile, stderr to $work/NAME.err.
chrome() {
  local name=$1; shift
  timeout --kill-after=5 60 "$chrome" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --no-first-run --no-default-browser-check --user-data-dir="$work/profile-$name" "$@" \
    2>"$work/$name.err" </dev/null
}

fails=()
fail() { fails+=("$1"); }
# Debian's launcher warns "/usr/bin/chromium: 9: [: ...: unexpected operator" (its /dev/shm test
# breaks when findmnt prints two lines); harmless, so left out of what is shown.
err_tail() { grep -v -e 'dbus' -e 'unexpected operator' "$work/$1.err" | tail -n 5 | sed 's/^/    /' >&2 || true; }

echo "report-check: $report"

# --- screenshots -------------------------------------------------------------------------------
shots=()
for spec in desktop:1280,900 phone:390,844; do
  name=${spec%%:*}; size=${spec#*:}; png=$out/$name.png
  rm -f -- "$png"
  rc=0; chrome "$name" --screenshot="$png" --window-size="$size" "$url" >/dev/null || rc=$?
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    # A page that never finishes loading would hang every later run as well.
    echo "  $name.png  FAIL: chromium ran past 60 s: the page does not finish loading"
    echo "report-check: FAIL: the page hangs (no screenshot in 60 s); the other checks were not run"
    exit 1
  elif [[ $rc -ne 0 || ! -s $png ]]; then
    echo "report-check: chromium could not take the $name screenshot (exit $rc); its last lines:" >&2
    err_tail "$name"
    exit 2
  fi
  shots+=("$png")
done

# Not blank: a stdlib PNG decoder (zlib + the five filter types), then the share of pixels that
# differ from the most common colour, and the number of distinct colours.
if [[ ${#shots[@]} -gt 0 ]]; then
  rc=0
  python3 - "${shots[@]}" <<'PY' || rc=$?
import collections, os, struct, sys, zlib

def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, plte = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"PLTE":
            plte = body
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + n
    if depth != 8 or interlace:
        raise ValueError(f"unsupported PNG (bit depth {depth}, interlace {interlace})")
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ctype]
    raw = zlib.decompress(b"".join(idat))
    stride, bpp = w * channels, channels
    rows, prev = [], bytes(stride)
    for y in range(h):
        base = y * (stride + 1)
        ftype, line = raw[base], bytearray(raw[base + 1:base + 1 + stride])
        if ftype == 1:  # Sub
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif ftype == 2:  # Up: a bytewise add without carries, on whole rows as big integers
            a, b = int.from_bytes(line, "big"), int.from_bytes(prev, "big")
            lo, hi = int.from_bytes(b"\x7f" * stride, "big"), int.from_bytes(b"\x80" * stride, "big")
            line = bytearray((((a & lo) + (b & lo)) ^ ((a ^ b) & hi)).to_bytes(stride, "big"))
        elif ftype == 3:  # Average
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif ftype == 4:  # Paeth
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 255
        elif ftype != 0:
            raise ValueError(f"bad filter type {ftype} in row {y}")
        rows.append(bytes(line))
        prev = line
    pixels = b"".join(rows)
    if ctype == 3:  # palette indices stand for their colours
        channels = 1
    return w, h, channels, pixels

bad = 0
for path in sys.argv[1:]:
    name = os.path.basename(path)
    try:
        w, h, ch, px = decode(path)
    except Exception as e:  # a PNG this decoder cannot read is a failed check, not a crash
        print(f"  {name:<12} FAIL: cannot decode: {e}")
        bad += 1
        continue
    counts = collections.Counter(zip(*(px[i::ch] for i in range(ch))))
    total = w * h
    frac = 1 - counts.most_common(1)[0][1] / total
    ok = frac >= 0.01 and len(counts) > 3
    bad += not ok
    print(f"  {name:<12} {w}x{h}  {os.path.getsize(path)} bytes  non-background {100 * frac:.2f}%  "
          f"colours {len(counts)}  {'ok' if ok else 'FAIL: looks blank'}  ({path})")
sys.exit(1 if bad else 0)
PY
  [[ $rc -eq 0 ]] || fail "a screenshot looks blank or could not be decoded"
fi

# --- console log ---------------------------------------------------------------------------------
rc=0; chrome dump --enable-logging=stderr --v=0 --dump-dom "$url" >"$work/dom.html" || rc=$?
if [[ $rc -ne 0 || ! -s $work/dom.html ]]; then
  echo "report-check: chromium --dump-dom failed (exit $rc); its last lines:" >&2
  err_tail dump
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then fail "--dump-dom: chromium ran past 60 s"; else exit 2; fi
else
  # Every console message (any level), CSP block ("... violates the following Content Security
  # Policy directive ...", "Refused to ..." in older releases) and uncaught exception ("Uncaught
  # ReferenceError: ...") is a CONSOLE line; `CONSOLE(12)` is the format of older releases. Only
  # those lines count: the browser's own log (dbus, zygote, ...) is noise here.
  if grep -E ':CONSOLE[:(][0-9]+' "$work/dump.err" \
      | cut -c1-300 >"$work/console.txt"; then
    echo "  console log  FAIL: $(wc -l <"$work/console.txt") console line(s):"
    head -n 10 "$work/console.txt" | sed 's/^/    /'
    fail "console output in chromium's log"
  else
    echo "  console log  no console lines  ok"
  fi
fi

# --- DevTools probe ------------------------------------------------------------------------------
rc=0
timeout --kill-after=10 90 python3 - "$chrome" "$url" "$work/profile-probe" "$work/probe.err" <<'PY' || rc=$?
import json, os, select, signal, subprocess, sys, time
chrome, url, profile, errlog = sys.argv[1:5]
SIZES = [("desktop", 1280, 900), ("phone", 390, 844)]

def spawn():
    to_r, to_w = os.pipe()  # commands: we write, Chromium reads on fd 3
    fr_r, fr_w = os.pipe()  # replies and events: Chromium writes on fd 4
    def child():
        # close_fds would shut 3 and 4 after this hook; the pipes themselves are non-inheritable.
        a, b = os.dup(to_r), os.dup(fr_w)  # out of the way of fds 3 and 4 first
        os.dup2(a, 3); os.dup2(b, 4)
        os.set_inheritable(3, True); os.set_inheritable(4, True)
    proc = subprocess.Popen(
        [chrome, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--no-default-browser-check", "--remote-debugging-pipe", "--user-data-dir=" + profile,
         "--window-size=1280,900", "about:blank"],
        preexec_fn=child, close_fds=False, start_new_session=True, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=open(errlog, "w"))
    os.close(to_r); os.close(fr_w)
    return proc, to_w, fr_r

class Cdp:
    def __init__(self, w, r):
        self.w, self.r, self.buf, self.next_id, self.events = w, r, b"", 0, []
    def send(self, method, params=None, sid=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if sid:
            msg["sessionId"] = sid
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        return self.next_id
    def recv(self, deadline):
        while True:
            i = self.buf.find(b"\0")
            if i >= 0:
                msg, self.buf = json.loads(self.buf[:i]), self.buf[i + 1:]
                return msg
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                return None
            chunk = os.read(self.r, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self.buf += chunk
    def call(self, method, params=None, sid=None, timeout=20):
        want, deadline = self.send(method, params, sid), time.monotonic() + timeout
        while True:
            msg = self.recv(deadline)
            if msg is None:
                raise TimeoutError(f"no answer to {method} in {timeout} s")
            if msg.get("id") == want:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error'].get('message')}")
                return msg.get("result", {})
            self.events.append(msg)
    def wait_for(self, method, timeout):
        for m in self.events:
            if m.get("method") == method:
                return True
        deadline = time.monotonic() + timeout
        while True:
            msg = self.recv(deadline)
            if msg is None:
                return False
            self.events.append(msg)
            if msg.get("method") == method:
                return True

LOCAL = ("file:", "data:", "blob:", "about:")
MEASURE = """JSON.stringify((() => {
  const de = document.documentElement, cw = de.clientWidth, name = el =>
    el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
    (typeof el.className === 'string' && el.className.trim() ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
  // The innermost elements past the right edge (an SVG counts as one), widest first.
  const over = new Set([...document.querySelectorAll('body *')].filter(el =>
    !el.ownerSVGElement && el.getBoundingClientRect().right > cw + 1));
  const wide = [...over].filter(el => ![...el.children].some(c => over.has(c)))
    .map(el => [el.getBoundingClientRect().right, el]).sort((a, b) => b[0] - a[0]).slice(0, 3)
    .map(([r, el]) => name(el) + ' (right edge ' + Math.round(r) + 'px)');
  const broken = [...document.images].filter(i => i.complete && i.naturalWidth === 0)
    .map(i => (i.currentSrc || i.src || '(no src)').slice(0, 120));
  return {inner: innerWidth, cw, sw: de.scrollWidth, wide, broken};
})())"""

def text_of(args):
    return " ".join(str(a.get("value", a.get("description", a.get("type", "?")))) for a in args)[:200]

def main():
    proc, w, r = spawn()
    issues, closing = [], False
    try:
        cdp = Cdp(w, r)
        try:
            tid = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            sid = cdp.call("Target.attachToTarget", {"targetId": tid, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                cdp.call(domain + ".enable", sid=sid)
            cdp.call("Emulation.setDeviceMetricsOverride",
                     {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}, sid=sid)
        except Exception as e:
            print(f"  probe        cannot drive chromium over DevTools: {e}", file=sys.stderr)
            return 2
        nav = cdp.call("Page.navigate", {"url": url}, sid=sid)
        loaded = False
        if nav.get("errorText"):
            issues.append(f"navigation failed: {nav['errorText']}")
        elif not cdp.wait_for("Page.loadEventFired", 30):
            issues.append("the page's load event did not fire within 30 s")
        else:
            loaded = True
        cdp.wait_for("(drain late events)", 0.5)
        widths = []
        for label, width, height in SIZES if loaded else []:  # a hung page would not answer
            cdp.call("Emulation.setDeviceMetricsOverride",
                     {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, sid=sid)
            res = cdp.call("Runtime.evaluate", {"expression": MEASURE, "returnByValue": True}, sid=sid)
            m = json.loads(res["result"]["value"])
            widths.append(f"{label} {m['sw']}/{m['cw']}px")
            if m["sw"] > m["cw"]:
                issues.append(f"scrolls horizontally at {label} width {width}: content {m['sw']}px wide"
                              + (f", e.g. {'; '.join(m['wide'])}" if m["wide"] else ""))
            if label == "desktop":
                issues += [f"broken image: {src}" for src in m["broken"]]
        urls = {}
        for ev in cdp.events:
            meth, p = ev.get("method"), ev.get("params", {})
            if meth == "Runtime.consoleAPICalled":
                issues.append(f"console.{p.get('type')}: {text_of(p.get('args', []))}")
            elif meth == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                desc = d.get("exception", {}).get("description") or d.get("text", "")
                issues.append(f"uncaught exception: {desc.splitlines()[0] if desc else '?'}")
            elif meth == "Log.entryAdded":
                e = p.get("entry", {})
                if e.get("level") in ("error", "warning"):
                    where = f" ({e['url'][:120]})" if e.get("url") else ""
                    issues.append(f"{e['level']} ({e.get('source')}): {e.get('text', '')[:200]}{where}")
            elif meth == "Network.requestWillBeSent":
                u = p.get("request", {}).get("url", "")
                urls[p.get("requestId")] = u
                if not u.startswith(LOCAL):
                    issues.append(f"external request: {u[:160]}")
            elif meth == "Network.loadingFailed":
                u = urls.get(p.get("requestId"), "?")
                issues.append(f"failed to load {u[:160]}: {p.get('errorText')}"
                              + (f" (blocked: {p['blockedReason']})" if p.get("blockedReason") else ""))
        issues = list(dict.fromkeys(issues))
        if issues:
            print(f"  probe        FAIL: {len(issues)} problem(s):")
            for i in issues[:15]:
                print(f"    {i}")
            if len(issues) > 15:
                print(f"    ... and {len(issues) - 15} more")
        else:
            print("  probe        no console output, exceptions, external or failed loads, broken images")
        if widths:
            print(f"  width        scrollWidth/clientWidth: {', '.join(widths)}  "
                  f"{'ok' if not any('scrolls horizontally' in i for i in issues) else 'FAIL'}")
        cdp.send("Browser.close")
        closing = True
        return 1 if issues else 0
    finally:
        try:
            proc.wait(timeout=5 if closing else 0.1)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

# `timeout` stops the probe with SIGTERM: exit through `finally`, which takes Chromium down too.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
try:
    sys.exit(main())
except Exception as e:  # the probe itself broke: not a verdict on the report
    print(f"  probe        error: {type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(3)
PY
case $rc in
  0) ;;
  1) fail "the DevTools probe found problems" ;;
  124|137) fail "the DevTools probe ran past 90 s" ;;
  *) echo "report-check: the DevTools probe could not run (exit $rc); chromium's last lines:" >&2
     grep -v -e dbus -e 'unexpected operator' "$work/probe.err" | tail -n 5 | sed 's/^/    /' >&2 || true
     exit 2 ;;
esac

if [[ ${#fails[@]} -eq 0 ]]; then
  echo "report-check: ok"
else
  for f in "${fails[@]}"; do echo "report-check: FAIL: $f"; done
  exit 1
fi

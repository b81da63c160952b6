"""Run plateau soaks from Python and read their verdicts.

`run()` starts `plateau run SCENARIO ARGS...` (the same arguments as the command line), waits for
it, and returns a `Verdict`: the exit code, the verdict's JSON, the run directory and its report.
A soak decides one of three things, and only a pass is a pass: exit 0 pass, 1 growth that does not
level off, 4 undecided (too short to tell). Exit 2 is bad input (an unknown scenario or flag) and
raises `UsageError`, a `ValueError`: it is not a leak. Exit 3 (the harness or the server failed)
returns a verdict marked incomplete when the run wrote one, and raises `HarnessError` otherwise.

The pytest plugin (`plateau_soak.pytest_plugin`) wraps this in a fixture.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

__all__ = ["Verdict", "UsageError", "HarnessError", "find_plateau", "run", "EXIT_MEANINGS"]

EXIT_MEANINGS = {
    0: "pass",
    1: "fail: growth that does not level off",
    2: "bad input",
    3: "the harness or the target failed",
    4: "undecided: too little evidence (never a pass)",
}


class UsageError(ValueError):
    """plateau refused the scenario or an argument (exit 2): the message names it."""


class HarnessError(RuntimeError):
    """plateau could not run the soak (exit 3) and wrote no verdict."""


@dataclass
class Verdict:
    """What one soak decided."""

    exit_code: int
    #: verdict.json, as a dict.
    verdict: dict = field(repr=False)
    run_dir: Path
    #: report.html in the run directory (it may be missing for a run that failed early).
    report: Path
    #: The command that ran, as a list of arguments.
    command: list = field(repr=False)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def story(self) -> str:
        """The verdict's one line: what was judged and what grew."""
        return str(self.verdict.get("summary", EXIT_MEANINGS.get(self.exit_code, "unknown")))

    @property
    def failing(self) -> list:
        """Names of the metrics that failed."""
        return [m["name"] for m in self.verdict.get("metrics", []) if m.get("status") == "fail"]

    @property
    def known(self) -> list:
        """The known-growth entries the run was judged with, each with its `state` (accepted,
        exceeded, expired, unmatched) and what it matched."""
        return list(self.verdict.get("known", []))

    @property
    def undecided(self) -> list:
        """Names of the metrics this run could not decide."""
        return [m["name"] for m in self.verdict.get("metrics", []) if m.get("status") == "inconclusive"]

    def explain(self) -> str:
        """A message for people: the outcome, the story, the failing metrics, where the report is."""
        lines = [f"plateau: {EXIT_MEANINGS.get(self.exit_code, f'exit {self.exit_code}')}: {self.story}"]
        if self.failing:
            lines.append("failing: " + ", ".join(self.failing))
        if self.undecided:
            lines.append("undecided: " + ", ".join(self.undecided))
        for k in self.known:
            if k.get("state") != "accepted":
                lines.append(f"known entry {k.get('entry')} ({k.get('site')}): {k.get('state')}")
        for w in self.verdict.get("warnings", []):
            lines.append(f"note: {w}")
        lines.append(f"report: {self.report}")
        lines.append("command: " + " ".join(self.command))
        return "\n".join(lines)


def find_plateau() -> str:
    """The `plateau` binary: $PLATEAU, else the one installed beside this Python (pip), else PATH."""
    env = os.environ.get("PLATEAU")
    if env:
        if not os.access(env, os.X_OK):
            raise FileNotFoundError(f"PLATEAU={env}: not an executable file")
        return env
    exe = "plateau" + (".exe" if sys.platform == "win32" else "")
    for scheme in (sysconfig.get_default_scheme(), "posix_user" if os.name == "posix" else "nt_user"):
        try:
            scripts = sysconfig.get_path("scripts", scheme)
        except KeyError:
            continue
        candidate = Path(scripts) / exe
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(exe)
    if found:
        return found
    raise FileNotFoundError(
        "the plateau binary was not found beside this Python nor on PATH: install it with "
        "`pip install plateau-soak` (or `pip install .` in a plateau checkout, or "
        "`cargo install --path soak`), or set PLATEAU=/path/to/plateau"
    )


def run(scenario: str, *args: str, run_dir: "os.PathLike[str] | str | None" = None, timeout: "float | None" = None) -> Verdict:
    """Runs `plateau run SCENARIO ARGS...` into `run_dir` (a new directory; default: plateau's
    own `runs/NAME-TIME`) and returns its verdict. `args` are the command line's (`--iterations`,
    `--seed`, `--inject`, `--target` and `--spawn` for a server, ...)."""
    if not isinstance(scenario, str) or not scenario:
        raise UsageError(f"scenario: {scenario!r}: give a shipped scenario's name or a .toml file")
    bad = [a for a in args if not isinstance(a, (str, os.PathLike))]
    if bad:
        raise UsageError(f"arguments must be strings (the command line's): {bad!r}")
    args_list = [os.fspath(a) for a in args]
    if run_dir is not None and "--out" in args_list:
        raise UsageError("give the run directory once: run_dir= or --out, not both")
    cmd = [find_plateau(), "run", scenario, *args_list]
    if "--quiet" not in args_list:
        cmd.append("--quiet")
    if run_dir is not None:
        cmd += ["--out", os.fspath(run_dir)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    stderr = proc.stderr.strip()
    if proc.returncode == 2:
        raise UsageError(_last_lines(stderr) or f"plateau refused: {' '.join(cmd)}")
    out = Path(run_dir) if run_dir is not None else _out_dir_from(stderr, args_list)
    verdict = _read_verdict(out)
    if verdict is None:
        if proc.returncode in (0, 1, 4):
            raise HarnessError(f"plateau exited {proc.returncode} but wrote no verdict.json in {out}: {_last_lines(stderr)}")
        raise HarnessError(f"plateau exited {proc.returncode} without a verdict: {_last_lines(stderr)}")
    return Verdict(proc.returncode, verdict, out, out / "report.html", cmd)


def _read_verdict(out: "Path | None") -> "dict | None":
    if out is None:
        return None
    try:
        return json.loads((out / "verdict.json").read_text())
    except (OSError, ValueError):
        return None


def _out_dir_from(stderr: str, args: Sequence[str]) -> "Path | None":
    """The run directory: --out as given, else the one plateau names in its last line."""
    if "--out" in args:
        i = args.index("--out")
        if i + 1 < len(args):
            return Path(args[i + 1])
    for line in reversed(stderr.splitlines()):
        marker = "results in "
        if marker in line:
            return Path(line.split(marker, 1)[1].strip())
    return None


def _last_lines(text: str, n: int = 5) -> str:
    return "\n".join(text.splitlines()[-n:])


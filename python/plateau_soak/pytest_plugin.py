"""The pytest plugin (registered as `plateau` through the `pytest11` entry point): a fixture that
runs soaks and turns their verdicts into test outcomes.

    def test_no_leak(plateau):
        plateau.assert_no_growth("n-sampling", "--iterations", "60")

    def test_my_server(plateau):
        plateau.assert_no_growth("n-sampling", "--target", "http://127.0.0.1:8000",
                                 "--spawn", "python3 my_server.py --port 8000")

Each soak writes into a directory of its own under the test's `tmp_path`, or under
`--plateau-runs DIR` (kept after the session: point CI's artifact upload at it). Every soak's
report.html is attached to the test's JUnit XML as a property (`plateau_report`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from . import UsageError, Verdict, run

__all__ = ["Plateau"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("plateau", "plateau soak tests")
    group.addoption(
        "--plateau-runs",
        metavar="DIR",
        default=None,
        help="keep every soak's run directory under DIR (default: the test's tmp_path)",
    )
    group.addoption(
        "--plateau-known",
        metavar="FILE",
        default=None,
        help="judge every soak of a server with this known-growth file (`plateau run --known`)",
    )


class Plateau:
    """What the `plateau` fixture gives a test: `run` and `assert_no_growth`."""

    def __init__(self, base: Path, name: str, request: pytest.FixtureRequest):
        self._base = base
        self._name = name
        self._request = request
        self._count = 0
        self.verdicts: list = []

    def _next_dir(self) -> Path:
        self._count += 1
        d = self._base / f"{self._name}-{self._count}"
        if d.exists():
            raise UsageError(f"{d}: already exists; plateau writes each run into a new directory")
        return d

    def run(self, scenario: str, *args: str, timeout: "float | None" = None, known: "str | Path | None" = None) -> Verdict:
        """Runs a soak with the command line's arguments and returns its verdict, whatever it
        decided. `known` (else `--plateau-known`) is a known-growth file for a soak of a server:
        growth reported upstream, accepted only at or under its rate and before its date. Bad
        input raises `plateau_soak.UsageError` (a ValueError), never a verdict."""
        run_dir = None if "--out" in args else self._next_dir()
        known = known if known is not None else self._request.config.getoption("--plateau-known")
        if known is not None and "--known" not in args:
            args = (*args, "--known", str(known))
        v = run(scenario, *args, run_dir=run_dir, timeout=timeout)
        self.verdicts.append(v)
        self._request.node.user_properties.append(("plateau_report", str(v.report)))
        return v

    def assert_no_growth(
        self, scenario: str, *args: str, timeout: "float | None" = None, known: "str | Path | None" = None
    ) -> Verdict:
        """The verdict of a soak that passed; `AssertionError` for any other outcome (a leak, an
        undecided run: too short to tell is a failed test, not a pass; an incomplete run), with
        the verdict's story, the failing metrics and the report's path."""
        v = self.run(scenario, *args, timeout=timeout, known=known)
        if not v.passed:
            raise AssertionError(v.explain())
        return v


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80] or "test"


@pytest.fixture
def plateau(request: pytest.FixtureRequest, tmp_path: Path) -> Plateau:
    """Runs plateau soaks for this test; see `Plateau`."""
    runs = request.config.getoption("--plateau-runs")
    base = Path(runs) if runs else tmp_path
    base.mkdir(parents=True, exist_ok=True)
    return Plateau(base, _safe(request.node.name), request)

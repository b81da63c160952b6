"""The installed package end to end: the `plateau` fixture against plateau's own engine and
against a server it spawns, bad input, and the JUnit property. Run against the installed wheel:
`pip install . && pytest python/tests` (CI does)."""

import socket
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points

import pytest

import plateau_soak

pytest_plugins = ["pytester"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_clean_soak_passes_and_returns_its_verdict(plateau):
    v = plateau.assert_no_growth("n-sampling", "--iterations", "60")
    assert v.passed and v.exit_code == 0 and v.failing == []
    assert v.verdict["verdict"] == "pass" and v.story.startswith("pass")
    assert v.report.exists() and (v.run_dir / "samples.jsonl").exists()


def test_a_leak_fails_with_the_story_the_metrics_and_the_report(plateau):
    with pytest.raises(AssertionError) as failure:
        plateau.assert_no_growth("n-sampling", "--iterations", "25", "--inject", "registry-retains-finished")
    message = str(failure.value)
    assert "registry.requests" in message and "report: " in message and "report.html" in message
    v = plateau.verdicts[-1]
    assert v.exit_code == 1 and "registry.requests" in v.failing


def test_a_too_short_run_is_a_failed_test_not_a_pass(plateau):
    v = plateau.run("n-sampling", "--iterations", "3")
    assert v.exit_code == 4 and not v.passed
    with pytest.raises(AssertionError, match="undecided"):
        plateau.assert_no_growth("n-sampling", "--iterations", "3")


def test_a_server_plateau_spawns_is_soaked_the_same_way(plateau):
    port = free_port()
    binary = plateau_soak.find_plateau()
    v = plateau.assert_no_growth(
        "n-sampling", "--iterations", "30", "--warmup", "10",
        "--target", f"http://127.0.0.1:{port}", "--spawn", f"{binary} serve --port {port}",
    )
    assert any(m["name"].startswith("target.") for m in v.verdict["metrics"])


def test_a_known_growth_file_is_passed_on_and_its_entries_are_in_the_verdict(plateau, tmp_path):
    port = free_port()
    binary = plateau_soak.find_plateau()
    known = tmp_path / "known.toml"
    known.write_text(
        '[[known]]\nprocess = "*"\nsite = "nothing_here"\nmax_per_request = "1KiB"\n'
        'reason = "upstream issue 1"\nuntil = "2999-01-01"\n'
    )
    v = plateau.assert_no_growth(
        "n-sampling", "--iterations", "30", "--warmup", "10",
        "--target", f"http://127.0.0.1:{port}", "--spawn", f"{binary} serve --port {port}", known=known,
    )
    assert [k["state"] for k in v.known] == ["unmatched"] and "known growth" in v.story
    known.write_text('[[known]]\nsite = "(unclosed"\n')
    with pytest.raises(plateau_soak.UsageError, match="known.toml: entry 1"):
        plateau.run("n-sampling", "--iterations", "5", "--target", f"http://127.0.0.1:{port}", known=known)


def test_bad_input_is_a_usage_error_naming_it(plateau):
    with pytest.raises(plateau_soak.UsageError, match="no-such-scenario"):
        plateau.run("no-such-scenario")
    with pytest.raises(ValueError, match="--no-such-flag"):
        plateau.run("n-sampling", "--no-such-flag")


def test_a_missing_binary_says_how_to_install_it(monkeypatch):
    monkeypatch.setenv("PLATEAU", "/nonexistent/plateau")
    with pytest.raises(FileNotFoundError, match="PLATEAU=/nonexistent/plateau"):
        plateau_soak.find_plateau()


def test_the_report_is_a_junit_property(pytester):
    pytester.makepyfile(
        """
        def test_soak(plateau):
            plateau.run("n-sampling", "--iterations", "3")
        """
    )
    # Installed, the plugin comes in through its entry point; from a checkout, by name.
    installed = any(ep.value == "plateau_soak.pytest_plugin" for ep in entry_points(group="pytest11"))
    by_name = [] if installed else ["-p", "plateau_soak.pytest_plugin"]
    result = pytester.runpytest("--junitxml=junit.xml", "-p", "no:cacheprovider", *by_name)
    result.assert_outcomes(passed=1)
    props = ET.parse(pytester.path / "junit.xml").getroot().iter("property")
    reports = [p.get("value") for p in props if p.get("name") == "plateau_report"]
    assert len(reports) == 1 and reports[0].endswith("report.html")

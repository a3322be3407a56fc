"""tests/slow_tiers.py: every slow test is in exactly one group, every file a group names holds slow tests,
and the runner's arguments and counts (read from the JUnit XML file pytest writes)."""

import subprocess
import sys

import pytest
import slow_tiers


@pytest.fixture(scope="module")
def slow_nodeids() -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-m", "slow", "-q",
                           "-p", "no:cacheprovider", "tests"], cwd=slow_tiers.REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    nodeids = [line for line in done.stdout.splitlines() if "::" in line]
    assert len(nodeids) > 50, done.stdout[-3000:]  # 83 when the groups were made
    return nodeids


def test_every_slow_test_is_in_exactly_one_group(slow_nodeids):
    misplaced = {nodeid: slow_tiers.tiers_of(nodeid) for nodeid in slow_nodeids
                 if len(slow_tiers.tiers_of(nodeid)) != 1}
    assert not misplaced, f"add each to one group of tests/slow_tiers.py TIERS: {misplaced}"


def test_every_file_a_group_names_holds_slow_tests(slow_nodeids):
    for name, (_, paths) in slow_tiers.TIERS.items():
        for path in paths:
            assert (slow_tiers.REPO / path).exists(), f"{name}: {path} does not exist"
            assert any(nodeid.startswith(path) for nodeid in slow_nodeids), f"{name}: no slow test in {path}"


def test_groups_and_pytest_arguments():
    assert slow_tiers.parse_args([]) == (list(slow_tiers.TIERS), [])
    assert slow_tiers.parse_args(["e2e", "--", "-x", "-k", "resume"]) == (["e2e"], ["-x", "-k", "resume"])
    with pytest.raises(SystemExit, match="unknown group 'layouts'; the groups: integration, e2e, examples"):
        slow_tiers.parse_args(["layouts"])


def test_counts_come_from_the_junit_file(tmp_path):
    xml = tmp_path / "g.xml"
    xml.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest" errors="1" failures="2" skipped="1" '
                   'tests="9" time="60.0"></testsuite></testsuites>')
    counts = slow_tiers.junit_counts(xml)
    assert counts == {"passed": 5, "failed": 2, "errors": 1, "skipped": 1}
    assert slow_tiers.summary("e2e", counts, 12.34) == \
        "slow tier e2e: 5 passed, 2 failed, 1 errors, 1 skipped in 12.3 min"
    assert slow_tiers.summary("e2e", {"passed": 3, "failed": 0, "errors": 0, "skipped": 0}, 1.0) == \
        "slow tier e2e: 3 passed in 1.0 min"


def test_after_ctrl_c_a_group_gets_time_to_end_then_is_killed():
    """A pytest that ends within the grace keeps its exit code (and wrote its JUnit file); one that does
    not is killed."""
    ends = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.2); sys.exit(3)"])
    assert slow_tiers.wait_after_interrupt(ends, 30) == 3
    hangs = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert slow_tiers.wait_after_interrupt(hangs, 0.5) < 0  # killed: a signal's negative code

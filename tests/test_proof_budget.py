"""Proof budgets are z3 resource units: the same rule and budget give the same answer on a busy machine."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from xflow.verifier import numeric_check, prove_rule
from xflow.verifier.batch import verify_candidate
from xflow.verifier.status import OutcomeStatus

from tests.rulebook import MATMUL_MERGE
from xflow.rules import parse_rule


@contextmanager
def busy_machine(processes: int) -> Iterator[None]:
    """Keep every core busy with spinning processes for the duration of the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for proc in spinners:
            proc.kill()
        for proc in spinners:
            proc.wait()


def test_a_proof_gives_the_same_answer_and_count_on_a_busy_machine():
    rule = parse_rule(MATMUL_MERGE)
    quiet = prove_rule(rule)
    assert quiet.status == OutcomeStatus.PROVED and quiet.rlimit_used > 0, quiet
    quiet_short = prove_rule(rule, rlimit=quiet.rlimit_used // 3)
    with busy_machine(2 * (os.cpu_count() or 1)):
        busy = prove_rule(rule)
        # too small a budget: not proved, loaded or quiet, however long it runs
        busy_short = prove_rule(rule, rlimit=quiet.rlimit_used // 3)
    assert (busy.status, busy.rlimit_used) == (quiet.status, quiet.rlimit_used)
    assert quiet_short.status == OutcomeStatus.UNKNOWN and "resource limit" in quiet_short.reason, quiet_short
    assert (busy_short.status, busy_short.rlimit_used) == (quiet_short.status, quiet_short.rlimit_used)


def test_the_wall_clock_guard_is_reported_as_a_timeout_not_unknown():
    rule = parse_rule(MATMUL_MERGE)
    guarded = prove_rule(rule, rlimit=10**12, guard_s=1e-6)
    assert guarded.status in ("timeout", "proved"), guarded
    if guarded.status == OutcomeStatus.TIMEOUT:
        assert "wall-clock guard" in guarded.reason


def test_a_proved_candidate_records_its_budget_in_resource_units():
    outcome = verify_candidate({**MATMUL_MERGE, "variants": [MATMUL_MERGE]}, rlimit=5_000_000)
    assert outcome.status == OutcomeStatus.PROVED, outcome.statuses
    z3_record = outcome.rule["provenance"]["z3"]
    assert z3_record["rlimit"] == 5_000_000 and 0 < z3_record["rlimit_used"] <= 5_000_000
    assert "seconds" not in z3_record and "timeout_ms" not in z3_record


@pytest.mark.parametrize("budget", [1, 1000])
def test_a_tiny_budget_is_unknown_never_proved(budget):
    assert prove_rule(parse_rule(MATMUL_MERGE), rlimit=budget).status == OutcomeStatus.UNKNOWN


PINNED_SPLIT = {
    "name": "split_concat_pinned", "doc": "split[(4, 4)](concat(x1, x2)) -> x1, x2 on 4-wide inputs",
    "inputs": {"x1": "any", "x2": "any"},
    "src": [{"op": "concat", "in": ["x1", "x2"], "out": ["c"], "attrs": {"axis": 1}},
            {"op": "split", "in": ["c"], "out": ["s1", "s2"], "attrs": {"axis": 1, "split": [4, 4]}}],
    "dst": [],
    "outputs": {"s1": "x1", "s2": "x2"},
    "where": ["rank(x1) == 2", "rank(x2) == 2"],
    "provenance": {"found_on": {"x1": [4, 4], "x2": [4, 4]}},
}


def test_a_variant_pinned_to_its_found_shapes_is_checked_near_them():
    """Shapes drawn by role alone never make both inputs 4 wide; the shapes the generator found the pair on,
    and shapes near them, do."""
    rule = parse_rule(PINNED_SPLIT)
    assert numeric_check(rule, trials=3, attempts=500).trials_run == 0
    near = numeric_check(rule, trials=3, attempts=500, found_on={"x1": (4, 4), "x2": (4, 4)})
    assert near.ok and near.trials_run == 6, near  # twice the trials when found shapes are given
    assert verify_candidate({**PINNED_SPLIT, "variants": [PINNED_SPLIT]}).status == OutcomeStatus.PROVED

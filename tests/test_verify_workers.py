"""Verifier workers: a candidate that kills its process costs only its own outcome, never a hang."""

from __future__ import annotations


def test_a_worker_that_dies_costs_only_its_own_item():
    from tests._workers import double_or_die
    from verifier.batch import run_guarded

    work = [1, 2, -1, 3, 4, 5]
    results: dict[int, int | None] = {}
    run_guarded(double_or_die, work, list(range(len(work))), 2, False, results.__setitem__)
    assert results == {0: 2, 1: 4, 2: None, 3: 6, 4: 8, 5: 10}

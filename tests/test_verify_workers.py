"""Verifier workers: a candidate that kills its process costs only its own outcome, never a hang."""

from __future__ import annotations


def test_a_worker_that_dies_costs_only_its_own_item():
    from xflow.verifier.batch import run_guarded

    from tests._workers import double_or_die

    work = [1, 2, -1, 3, 4, 5]
    results: dict[int, int | None] = {}
    run_guarded(double_or_die, work, list(range(len(work))), 2, False, results.__setitem__)
    assert results == {0: 2, 1: 4, 2: None, 3: 6, 4: 8, 5: 10}


class _Reads(list):
    """Work items that count how many were read."""

    read = 0

    def __getitem__(self, index):  # noqa: ANN001, ANN204
        type(self).read += 1
        return super().__getitem__(index)


def test_items_are_read_as_they_are_handed_out_not_all_at_once():
    """A pending item holds its work (a verifier task holds its candidates): a run of many items keeps only a few
    ahead of the workers, and still gives every result."""
    from xflow.verifier.batch import SUBMIT_AHEAD, run_guarded

    from tests._workers import double_or_die

    work = _Reads(range(1, 61))
    seen: dict[int, int | None] = {}
    read_at_first: list[int] = []

    def record(i: int, result: int | None) -> None:
        if not seen:
            read_at_first.append(_Reads.read)
        seen[i] = result

    run_guarded(double_or_die, work, list(range(len(work))), 2, False, record)
    assert read_at_first[0] <= SUBMIT_AHEAD * 2 < len(work)
    assert seen == {i: 2 * (i + 1) for i in range(60)}

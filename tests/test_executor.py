"""The rule pipeline's tasks give the same rule file on the local pool and on Ray."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from xflow.cli import main
from xflow.errors import XflowError
from xflow.tasks import LocalTaskExecutor, RayTaskExecutor, make_task_executor


def _square(x: int) -> int:
    return x * x


@pytest.mark.parametrize("jobs", [1, 2])
def test_local_executor_maps_in_order_and_unordered(jobs):
    executor = LocalTaskExecutor(jobs)
    try:
        assert list(executor.imap(_square, range(20))) == [x * x for x in range(20)]
        assert sorted(executor.imap_unordered(_square, range(20))) == [x * x for x in range(20)]
    finally:
        executor.close()


def _shared_row(args: tuple) -> list[int]:
    shared, row = args
    return shared.get()[row]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_shared_value_reaches_every_task(jobs):
    table = [[row * 10 + col for col in range(3)] for row in range(6)]
    executor = LocalTaskExecutor(jobs)
    try:
        shared = executor.share(table)
        assert list(executor.imap(_shared_row, [(shared, row) for row in range(6)])) == table
    finally:
        executor.close()


@pytest.mark.slow
def test_ray_puts_a_shared_value_once_and_tasks_read_it():
    pytest.importorskip("ray")
    import pickle

    import numpy as np

    table = np.arange(1 << 20, dtype=np.int64).reshape(64, -1)  # 8 MB
    executor = RayTaskExecutor(2)
    try:
        shared = executor.share(table)
        assert len(pickle.dumps(shared)) < 10_000  # an item carries a reference, not the 8 MB
        rows = list(executor.imap(_shared_row, [(shared, row) for row in (0, 17, 63)]))
        assert all(np.array_equal(got, table[row]) for got, row in zip(rows, (0, 17, 63), strict=True))
    finally:
        executor.close()


def test_unknown_executor_or_a_stray_address_is_a_user_error():
    with pytest.raises(XflowError):
        make_task_executor("spark", 2)
    with pytest.raises(XflowError):
        make_task_executor("local", 2, address="auto")


def _generate(tmp_path, name: str, *extra: str) -> bytes:
    out = tmp_path / name
    # a small proof budget: the one candidate z3 cannot settle costs little, and the files must still agree
    result = CliRunner().invoke(main, ["generate-rules", "--max-ops", "1", "--jobs", "2", "--seed", "3", "-q",
                                       "--rlimit", "1000000", "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return out.read_bytes()


def test_the_same_seed_gives_the_same_rule_file_twice_locally(tmp_path):
    assert _generate(tmp_path, "a.json") == _generate(tmp_path, "b.json")


@pytest.mark.slow
def test_ray_and_the_local_pool_write_byte_identical_rule_files(tmp_path):
    pytest.importorskip("ray")
    local = _generate(tmp_path, "local.json")
    on_ray = _generate(tmp_path, "ray.json", "--executor", "ray")
    assert b'"rules"' in local and local == on_ray

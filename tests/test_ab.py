"""The end-to-end A/B timing that decides whether ``xflow optimize`` writes its model: interleaved
rounds, and "faster" only when most rounds say so (a one-sided sign test), not one lucky median."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xflow.runtime import ABResult, decide_ab, make_session, measure_ab, random_feeds, sign_test


def test_sign_test_is_the_binomial_tail():
    assert sign_test(10, 10) == pytest.approx(1 / 1024)
    assert sign_test(9, 10) == pytest.approx(11 / 1024)
    assert sign_test(0, 10) == 1.0
    assert sign_test(0, 0) == 1.0


def test_a_lower_median_alone_is_not_faster():
    assert ABResult(1.0, 0.9, runs=10, b_wins=10).b_is_faster()
    assert not ABResult(1.0, 0.9, runs=10, b_wins=6).b_is_faster()  # p = 0.38: a coin could do that
    assert not ABResult(1.0, 1.1, runs=10, b_wins=10).b_is_faster()  # most rounds, but a higher median


def _matmul_chain(depth: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", [f"h{k}", "W"], [f"h{k + 1}"]) for k in range(depth)]
    model = helper.make_model(helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [64, 256])],
        [helper.make_tensor_value_info(f"h{depth}", TensorProto.FLOAT, [64, 256])],
        [numpy_helper.from_array((rng.standard_normal((256, 256)) / 16).astype(np.float32), "W")]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_measure_ab_finds_the_model_with_a_tenth_of_the_work_faster_and_not_the_reverse():
    # One thread each and a second of rounds: with two threads on a machine whose cores are busy, a run's
    # time is mostly waiting for a core, and 0.1 s of rounds measured the larger model faster.
    small, large = make_session(_matmul_chain(2), threads=1), make_session(_matmul_chain(20), threads=1)
    feeds = random_feeds(small, 0)
    faster = measure_ab(large, small, feeds, min_runs=10, target_seconds=1.0)
    slower = measure_ab(small, large, feeds, min_runs=10, target_seconds=1.0)
    assert faster.b_is_faster() and faster.b_wins >= 9
    assert not slower.b_is_faster() and slower.runs >= 10


def test_faster_is_decided_by_two_session_pairs_that_agree():
    """A model 10x lighter is faster in the first two pairs: decided after two; a heavier one is turned away
    after two pairs as well."""
    small, large = _matmul_chain(2), _matmul_chain(20)
    made: list[int] = []

    def fresh(a: onnx.ModelProto, b: onnx.ModelProto):  # noqa: ANN202 - two ORT sessions
        made.append(1)
        return make_session(a, threads=1), make_session(b, threads=1)

    feeds = random_feeds(make_session(small, threads=1), 0)
    timing = {"min_runs": 10, "target_seconds": 0.5}
    faster = decide_ab(*fresh(large, small), feeds, lambda: fresh(large, small), **timing)
    assert faster.b_is_faster() and faster.pairs == 2 and len(made) == 2
    made.clear()
    slower = decide_ab(*fresh(small, large), feeds, lambda: fresh(small, large), **timing)
    assert not slower.b_is_faster() and slower.pairs == 2 and len(made) == 2


def test_finalists_are_timed_end_to_end_and_the_fastest_is_picked(tmp_path):
    """``xflow optimize`` times the search's graphs from different branches against each other and keeps
    the fastest, whatever their estimated costs said."""
    from xflow.onnx_io import graph_from_model
    from xflow.pipeline import Finalist, OptimizeOptions, select_by_latency
    from xflow.rewrite.simplify import Simplified

    original = tmp_path / "in.onnx"
    onnx.save(_matmul_chain(20), original)
    finalists = [Finalist(Simplified(graph_from_model(_matmul_chain(depth))), cost, ())
                 for depth, cost in ((20, 1.0), (2, 2.0), (10, 0.5))]
    feeds = random_feeds(make_session(str(original)), 0)
    picked = select_by_latency(finalists, feeds, OptimizeOptions(threads=1), str(tmp_path),
                               rounds=15, seconds=0.3)  # one thread: see the test above
    assert picked is not None and picked.index == 1
    assert all(m is not None for m in picked.medians)  # every finalist ORT runs is timed
    assert picked.medians[1] == min(picked.medians)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx"]  # timed from memory: no scratch file left


@pytest.mark.parametrize(("votes", "faster", "pairs"), [
    ("FF", True, 2), ("SS", False, 2), ("FSFF", True, 4), ("SFFF", True, 4), ("FSFS", False, 4),
    ("FSS", False, 3), ("SFS", False, 3)])
def test_the_decision_rule_over_session_pairs(monkeypatch, votes, faster, pairs):
    """Two pairs that agree settle it; after a split, B must win both of the next two; two losses end it."""
    import xflow.runtime as runtime

    script = iter(votes)
    monkeypatch.setattr(runtime, "measure_ab", lambda a, b, feeds, **timing: (
        ABResult(1.0, 0.9, 10, 10) if next(script) == "F" else ABResult(1.0, 1.1, 10, 0)))
    result = runtime.decide_ab(None, None, {}, lambda: (None, None))
    assert result.b_is_faster() == faster and result.pairs == pairs
    assert next(script, None) is None  # no pair measured beyond the deciding one

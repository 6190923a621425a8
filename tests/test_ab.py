"""The end-to-end A/B timing that decides whether ``xflow optimize`` writes its model: interleaved rounds on
pairs of fresh sessions, and "faster" only when the pairs say so (a one-sided signed-rank test), not one lucky
median or one lucky session."""

from __future__ import annotations

import os
import weakref

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xflow.ort import open_session
from xflow.runtime import ABResult, decide_ab, measure_ab, random_feeds, sign_test, signed_rank_p


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
    small, large = open_session(_matmul_chain(2), threads=1), open_session(_matmul_chain(20), threads=1)
    feeds = random_feeds(small, 0)
    faster = measure_ab(large, small, feeds, min_runs=10, target_seconds=1.0)
    slower = measure_ab(small, large, feeds, min_runs=10, target_seconds=1.0)
    assert faster.b_is_faster() and faster.b_wins >= 9
    assert not slower.b_is_faster() and slower.runs >= 10


def test_faster_is_decided_over_fresh_session_pairs():
    """A model 10x lighter is faster over every planned pair; a heavier one is turned away as soon as the
    pairs it lost rule "faster" out (two losses of eight)."""
    small, large = _matmul_chain(2), _matmul_chain(20)
    made: list[str] = []

    def fresh(a: onnx.ModelProto, b: onnx.ModelProto):  # noqa: ANN202 - a maker of ORT sessions
        def make(side: str):  # noqa: ANN202
            made.append(side)
            return open_session(a if side == "a" else b, threads=1)
        return make

    feeds = random_feeds(open_session(small, threads=1), 0)
    timing = {"min_runs": 10, "target_seconds": 0.1, "min_pairs": 8, "max_pairs": 8}
    faster = decide_ab(open_session(large, threads=1), open_session(small, threads=1), feeds, fresh(large, small),
                       **timing)
    assert faster.b_is_faster() and faster.pairs == 8 and faster.b_wins == 8
    assert faster.p_value == pytest.approx(1 / 256)
    assert made == ["b", "a", "a", "b"] * 3 + ["b", "a"]  # 7 fresh pairs, in alternating order
    made.clear()
    slower = decide_ab(open_session(small, threads=1), open_session(large, threads=1), feeds, fresh(small, large),
                       **timing)
    assert not slower.b_is_faster() and slower.pairs == 2 and len(made) == 2


def test_finalists_are_timed_end_to_end_and_the_fastest_is_picked(tmp_path):
    """``xflow optimize`` times the search's graphs from different branches against each other and keeps
    the fastest, whatever their estimated costs said."""
    from xflow.onnx_io import graph_from_model
    from xflow.optimize.finalize import Finalist
    from xflow.optimize.select import select_by_latency
    from xflow.ort import Sessions
    from xflow.rewrite.simplify import Simplified

    original = tmp_path / "in.onnx"
    onnx.save(_matmul_chain(20), original)
    finalists = [Finalist(Simplified(graph_from_model(_matmul_chain(depth))), cost, ())
                 for depth, cost in ((20, 1.0), (2, 2.0), (10, 0.5))]
    feeds = random_feeds(open_session(str(original)), 0)
    picked = select_by_latency(finalists, feeds, Sessions(threads=1, scratch=str(tmp_path)),
                               rounds=15, seconds=0.3)  # one thread: see the test above
    assert picked is not None and picked.index == 1
    assert all(m is not None for m in picked.medians)  # every finalist ORT runs is timed
    assert picked.medians[1] == min(picked.medians)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx"]  # no scratch file left


@pytest.mark.parametrize(("ratios", "faster", "pairs"), [
    ("+5 +5 +5 +5 +5 +5 +5 +5", True, 8),  # 8 of 8: p = 1/256
    ("-1 +5 +5 +5 +5 +5 +5 +5", True, 8),  # the one lost pair the closest: rank sum 1, p = 2/256
    ("-5 +1 +2 +3 +4 +6 +7 +8", False, 2),  # one lost pair, larger than a won one: rank sum 2 already
    ("-1 -2 +5 +5", False, 2),  # two lost pairs: rank sum 3 > 1, no more pairs can undo it
    ("+5 +5 +5 +5 +5 +5 +5 -6", False, 8),  # lost the last by more than any was won: rank sum 8
    ("+5 +5 +5 +5 +5 +5 0 0", False, 8)])  # ties count as lost pairs: rank sum 3
def test_the_decision_over_session_pairs(monkeypatch, ratios, faster, pairs):
    """Eight pairs (a pair here is quick): B is faster when a one-sided signed-rank test over the pairs' log
    ratios passes at 0.01; the decision stops once the lost pairs' rank sum is past the bound."""
    import xflow.runtime as runtime

    script = iter(float(r) for r in ratios.split())
    monkeypatch.setattr(runtime, "measure_ab", lambda a, b, feeds, **timing: (
        ABResult(1.0, 1.0 / (1.0 + next(script) / 100), 10, 10)))
    result = runtime.decide_ab(None, None, {}, lambda side: None, min_pairs=8, max_pairs=8)
    assert result.b_is_faster() == faster and result.pairs == pairs


def test_the_signed_rank_test_is_exact():
    assert signed_rank_p([0.1] * 8) == pytest.approx(1 / 256)
    assert signed_rank_p([-0.01] + [0.1] * 7) == pytest.approx(2 / 256)
    assert signed_rank_p([0.5, -1.0, 2.0]) == pytest.approx(3 / 8)  # lost rank 2: subsets of {1,2,3} summing <= 2
    assert signed_rank_p([]) == 1.0


def test_finalists_are_screened_alone_then_the_fastest_two_halved_on_fresh_sessions(tmp_path, monkeypatch):
    """Each finalist is first timed alone (one session alive at a time), and only the fastest two go on to
    successive halving, where one session's luck lasting its life means each is timed on two fresh sessions."""
    from xflow.onnx_io import graph_from_model
    from xflow.optimize.finalize import Finalist
    from xflow.optimize.select import select_by_latency
    from xflow.ort import Sessions
    from xflow.rewrite.simplify import Simplified

    made: list[str] = []
    alive: list[int] = []
    real = Sessions.open
    live = weakref.WeakSet()

    def counting(self, model, *args, **kwargs):  # noqa: ANN001, ANN202 - the real maker, each session counted
        made.append(os.path.basename(model).removesuffix(".onnx"))
        session = real(self, model, *args, **kwargs)
        live.add(session)
        alive.append(len(live))
        return session

    feeds = random_feeds(open_session(_matmul_chain(2)), 0)  # before the count starts
    monkeypatch.setattr(Sessions, "open", counting)
    finalists = [Finalist(Simplified(graph_from_model(_matmul_chain(depth))), 1.0, ()) for depth in (20, 2, 10, 15)]
    picked = select_by_latency(finalists, feeds, Sessions(threads=1, scratch=str(tmp_path)), rounds=5, seconds=0.1)
    assert picked.index == 1
    # four screened alone, then the faster two (the 2- and 10-deep chains) on two sessions each
    assert made[:4] == ["finalist0", "finalist1", "finalist2", "finalist3"]
    assert sorted(made[4:]) == ["finalist1", "finalist1", "finalist2", "finalist2"]
    assert max(alive[:4]) == 1  # the screen holds one session at a time
    assert all(m is not None for m in picked.medians)  # the dropped ones keep their screen figure
    assert not list(tmp_path.iterdir())  # the finalists' files are gone


def test_finalists_are_timed_from_memory_when_their_files_cannot_be_written(tmp_path):
    from xflow.onnx_io import graph_from_model
    from xflow.optimize.finalize import Finalist
    from xflow.optimize.select import select_by_latency
    from xflow.ort import Sessions
    from xflow.rewrite.simplify import Simplified

    finalists = [Finalist(Simplified(graph_from_model(_matmul_chain(depth))), 1.0, ()) for depth in (20, 2)]
    feeds = random_feeds(open_session(_matmul_chain(2)), 0)
    picked = select_by_latency(finalists, feeds, Sessions(threads=1, scratch=str(tmp_path / "gone")), rounds=15,
                               seconds=0.3)
    assert picked.index == 1 and all(m is not None for m in picked.medians)


def test_the_screen_hands_on_every_finalist_its_luck_could_have_hidden():
    """One session each cannot order finalists within a session's luck: those within 10% of the fastest screen
    figure go on to the halving with it (at most three), the fastest two always, a clearly slower one never."""
    from xflow.optimize.select import screened

    assert screened({0: 0.183, 1: 0.158, 2: 0.160, 3: 0.147, 4: 0.193, 5: 0.150, 6: 0.1495, 7: 0.285}) == [3, 6, 5]
    assert screened({0: 0.100, 1: 0.200, 2: 0.300}) == [0, 1]
    assert screened({0: 0.100, 1: 0.105}) == [0, 1] and screened({}) == []


def test_a_finalist_slower_at_another_profile_point_hands_over_to_the_next_by_time():
    """Faster at the decode step and not at the prefill: the next finalists by end-to-end time are tried (at most
    two, fastest first, none ORT refused, none the chosen graph again); for any other decision, none."""
    from types import SimpleNamespace

    from xflow.optimize.chain import runners_up
    from xflow.optimize.decision import Decision
    from xflow.optimize.select import Picked, Selected

    finalists = [SimpleNamespace(graph=SimpleNamespace(structural_hash=h)) for h in ("a", "b", "c", "a", "d")]
    selected = Selected(graph=None, chosen=finalists[0], picked=Picked(0, [0.10, 0.13, None, 0.11, 0.12]))
    assert runners_up(selected, finalists, Decision.NOT_FASTER_AT_EVERY_POINT) == [finalists[4], finalists[1]]
    for decision in (Decision.OPTIMIZED, Decision.NOT_FASTER, Decision.SIMPLER_NOT_SLOWER):
        assert runners_up(selected, finalists, decision) == []
    assert runners_up(Selected(graph=None, chosen=finalists[0]), finalists, Decision.NOT_FASTER_AT_EVERY_POINT) == []

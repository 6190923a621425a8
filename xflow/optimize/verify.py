"""The verify pass: the chosen graph's outputs against the original's (at every profile point and one off it),
then the A/B timing that decides whether it is written (``xflow.runtime.decide_ab``)."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from xflow import heap
from xflow.equivalence import (
    EquivalenceError,
    NonFiniteReference,
    PreparedCheck,
    check_equivalence,
    prepare_check,
    verify_against_original,
)
from xflow.errors import XflowError, one_line
from xflow.ir import Graph
from xflow.onnx_io.stream import write_model_file
from xflow.optimize.decision import Decision
from xflow.optimize.finalize import Finalist
from xflow.optimize.load import OriginalNotRunnable, OriginalRun, Source
from xflow.optimize.options import CheckSettings, InputSettings
from xflow.optimize.passes import PassResult
from xflow.optimize.remembered import Remembered
from xflow.optimize.size import graph_size
from xflow.ort import Sessions
from xflow.ort.graphs import fits_in_memory, session_maker
from xflow.runtime import NON_INFERIORITY_MARGIN, ABDecision, decide_ab, median_latency, random_feeds


@dataclass
class VerifyFigures:
    """The verify pass's figures, the A/B timing's included (the report carries them as they are)."""

    verified: bool = False
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    verify_reference: str = ""  # what the outputs were compared against (xflow.equivalence)
    verify_inputs: list[str] = field(default_factory=list)  # the input sets compared on, the run's own first
    verify_scales: list[str] = field(default_factory=list)  # then the draws at other scales (xflow.equivalence)
    latency_before_ms: float | None = None
    latency_after_ms: float | None = None
    speedup: float | None = None
    timed_runs: int = 0  # interleaved rounds over all session pairs
    session_pairs: int = 0  # pairs of fresh sessions (original, optimized) the A/B timed
    faster_pairs: int = 0  # pairs in which the optimized model's median was the lower
    rank_test_p: float | None = None  # the sequential signed-rank test's p over the pairs (written when < 0.01)
    simpler: bool = False  # fewer ONNX nodes or weight bytes than the original (``ModelSize.is_simpler_than``)
    # a simpler model's non-inferiority test: the signed-rank test of "more than 2% slower" over the pairs
    # (written when below NON_INFERIORITY_LEVEL at every profile point though not faster; None: not tested)
    not_slower_p: float | None = None
    pairs_ms: list[list[float]] = field(default_factory=list)  # the A/B's medians of each pair: [original, optimized]
    # dynamic models: the A/B at each profile point (the figures above are the first point's), and the
    # points equivalence was checked at besides the first (profile points and an off-profile one)
    profile_points: list[dict[str, Any]] = field(default_factory=list)
    checked_at: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Verified(PassResult):
    """The verify pass's result: the graph to write (None: the original), the decision, and the figures."""

    decision: Decision
    figures: VerifyFigures = field(default_factory=VerifyFigures)


@dataclass(frozen=True)
class Checked:
    """What verify compares: the original model and its run, the chosen finalist (None: none), the settings."""

    source: Source
    original: OriginalRun | OriginalNotRunnable | None
    chosen: Finalist | None
    checks: CheckSettings
    inputs: InputSettings
    no_rules: bool = False  # the rule file held none (what nothing chosen means)
    memo: Remembered | None = None  # the A/Bs the cost cache remembers (None: each one timed)


def verify(checked: Checked, sessions: Sessions, say: Callable[[str], None], output_label: str = "") -> Verified:
    """The verify pass: run the chosen graph on the original's inputs, compare the outputs (EquivalenceError when
    they differ or ORT refuses it), time both (interleaved) and keep the optimized one only when it is faster over
    pairs of fresh sessions, or simpler and not slower (``_decide``; or ``keep_if_slower``). With nothing chosen,
    only the original's latency is measured."""
    source, original, chosen, checks = checked.source, checked.original, checked.chosen, checked.checks
    if chosen is None:
        return _time_original(original, checks, source, say,
                              Decision.NO_RULES if checked.no_rules else Decision.NO_REWRITE)
    if not checks.verify and not checks.measure:  # nothing to run in ORT (and no weights to load there)
        return Verified(graph=chosen.graph, modified=True, decision=Decision.OPTIMIZED)
    if isinstance(original, OriginalNotRunnable) or original is None:
        problem = original.problem if original is not None else "the original was not run"
        say(f"{problem}: the rewrites cannot be verified, so the model is {source.kept_as}")
        return Verified(graph=None, decision=Decision.CANNOT_RUN)
    inputs = checked.inputs
    # the float64 reference's outputs first, its copy released: its weights and the candidate's are never resident
    # together (Swin-tiny: 224 MB of float64 weights beside two sessions of 107 MB)
    prepared = prepare_check(source.runnable, original.session, original.feeds, inputs.seed, source.measuring,
                             sessions, users_feeds=bool(inputs.npz)) if checks.verify else None
    with _candidate_file(chosen.graph, sessions) as path:
        try:
            # from a file written once (or, without one, bytes serialized for verify alone): not through the
            # finalist's cached proto and bytes, two copies of the weights that would live to the end of the run
            make_candidate = functools.partial(sessions.open, path) if path is not None else \
                session_maker(sessions, chosen.graph, "candidate")
            candidate = make_candidate()
            candidate.run(None, original.feeds)  # ORT runs it at all: refused here, said below
        except XflowError as exc:  # the scratch file could not be written: name the output, not the scratch path
            raise XflowError(output_label or source.label, f"{exc.problem} (writing the model to verify beside it)") \
                from None
        except Exception as exc:  # noqa: BLE001 - any ORT refusal of our output is reported the same way
            raise EquivalenceError(source.label, f"ONNX Runtime cannot run the optimized model, nothing written: "
                                                 f"{one_line(exc)}") from None
        figures = VerifyFigures()
        if checks.verify:
            refused = _compare_outputs(checked, original, candidate, sessions, figures, say, prepared)
            prepared = None  # the float64 outputs (and a copy kept open for large ones) not held under the A/B
            heap.trim()  # the float64 copy's session and runs, freed: not kept under the A/B's sessions
            if refused is not None:  # the original is written: no figures of a model not written
                return Verified(graph=None, decision=refused)
        decision = Decision.OPTIMIZED
        if checks.measure:
            handed = [candidate]
            del candidate  # the A/B's first pair takes it over, and lets it go before its fresh pairs are made
            decision = _decide(checked, original, handed, make_candidate, sessions, figures, say)
    return Verified(graph=chosen.graph if decision.writes_optimized else None,
                    modified=decision.writes_optimized, decision=decision, figures=figures)


@contextlib.contextmanager
def _candidate_file(graph: Graph, sessions: Sessions) -> Iterator[str | None]:
    """The candidate written once as one model file in the run's scratch folder (a weight at a time:
    ``write_model_file``), removed on exit, for its sessions to be read from as the original's are (from its file,
    weights inline: one mapped from a data file runs up to a few % slower): its weights are then not held in memory
    as bytes for the whole pass. None where there is no scratch folder, the file cannot be written, or the weights
    do not fit one protobuf (``session_maker`` writes those with external data for each session)."""
    if sessions.scratch is None or not fits_in_memory(graph):
        yield None
        return
    path = os.path.join(sessions.scratch, "candidate.onnx")
    try:
        write_model_file(graph, path)
    except OSError:  # nothing is left behind
        yield None
        return
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)


def _compare_outputs(checked: Checked, original: OriginalRun, candidate: Any, sessions: Sessions,
                     figures: VerifyFigures, say: Callable[[str], None],
                     prepared: PreparedCheck | None = None) -> Decision | None:
    """The outputs against the original's, at the run's inputs and then at the other sizes; the decision to keep
    the original when they cannot be compared or differ at other sizes (None: they match)."""
    source, inputs = checked.source, checked.inputs
    try:
        compared = verify_against_original(source.runnable, original.session, candidate, original.feeds,
                                           inputs.label, inputs.seed, source.measuring, sessions,
                                           users_feeds=bool(inputs.npz), prepared=prepared)
    except EquivalenceError as exc:
        raise EquivalenceError(source.label, f"optimized model is not equivalent, nothing written: {exc.problem}") \
            from None
    except NonFiniteReference as exc:
        say(f"{exc.problem}: the model is {source.kept_as}")
        return Decision.NOT_FINITE
    for note in compared.notes:
        say(note)
    figures.max_abs_diff, figures.verified = compared.max_abs_diff, True
    figures.verify_reference, figures.verify_inputs = compared.reference, compared.inputs
    figures.verify_scales = compared.scales
    failure = check_other_sizes(source, original.session, candidate, inputs.seed, figures)
    if failure is not None:
        say(f"{failure}: the original is {source.kept_as}")
        return Decision.NOT_EQUIVALENT_AT_OTHER_SIZES
    return None


def _decide(checked: Checked, original: OriginalRun, handed: list[Any], make_candidate: Callable[[], Any],
            sessions: Sessions, figures: VerifyFigures, say: Callable[[str], None]) -> Decision:
    """The A/B of the original and the candidate over pairs of fresh sessions, at every profile point: written when
    faster at each (``OPTIMIZED``), or, when it has fewer nodes or bytes and ``require_faster`` is off, when not
    slower at each (``SIMPLER_NOT_SLOWER``: within ``NON_INFERIORITY_MARGIN``, by the same test over the pairs)."""
    source, checks = checked.source, checked.checks
    chosen = checked.chosen
    assert chosen is not None
    simpler = source.size is not None and graph_size(chosen.graph).is_simpler_than(source.size)
    margin = NON_INFERIORITY_MARGIN if simpler and not checks.require_faster else None

    def fresh(side: str) -> Any:  # decide_ab's maker of fresh sessions: "a" the original, "b" the optimized graph
        return sessions.open(source.runnable) if side == "a" else make_candidate()
    # ``handed`` holds the candidate's warm session, the A/B's first B: a static model's is given away (decide_ab
    # lets go of its first pair before its fresh ones, one session's weights fewer alive); a dynamic model's other
    # points time it again
    candidate = handed[0] if source.dynamic is not None else None
    # a static model's first pair is handed over, the original's session too (made again if a later finalist is
    # verified): decide_ab then holds two sessions at a time, not four
    first_pair = [original.hand_over() if source.dynamic is None else original.session, handed.pop()]
    ab = _ab(checked, first_pair, original.feeds, fresh, margin)
    figures.latency_before_ms, figures.latency_after_ms = ab.a_median * 1e3, ab.b_median * 1e3
    figures.speedup, figures.timed_runs = ab.speedup, ab.runs
    figures.session_pairs, figures.faster_pairs, figures.rank_test_p = ab.pairs, ab.b_wins, ab.p_value
    figures.simpler, figures.not_slower_p = simpler, ab.not_slower_p
    figures.pairs_ms = [[r.a_median * 1e3, r.b_median * 1e3] for r in ab.results]
    first = _verdict(ab)
    others = {} if first == SLOWER or source.dynamic is None else \
        time_other_points(source, original.session, candidate, fresh, checked.inputs.seed, figures, margin, first,
                          checked)
    # "Faster" must be more than one lucky session, which a longer run does not reproduce: decide_ab asks
    # it of pairs of fresh sessions (a signed-rank test over them), and at every profile point; so does "not slower".
    verdicts = [first, *others.values()]
    if checks.keep_if_slower or all(v == FASTER for v in verdicts):
        return Decision.OPTIMIZED
    if all(v != SLOWER for v in verdicts):
        return Decision.SIMPLER_NOT_SLOWER
    override = "use --keep-if-slower to override"
    if first != SLOWER:
        slower_at = "; ".join(label for label, v in others.items() if v == SLOWER)
        within = "" if margin is None else f" nor within {NON_INFERIORITY_MARGIN:.0%} of the original's time"
        say(f"the optimized model was not measurably faster{within} at {slower_at}: "
            f"the original is {source.kept_as} ({override})")
        return Decision.NOT_FASTER_AT_EVERY_POINT
    tested = f"; within {NON_INFERIORITY_MARGIN:.0%}: p = {ab.not_slower_p:.2g}" if margin is not None else ""
    say(f"the optimized model was not measurably faster ({figures.latency_after_ms:.3f} ms vs "
        f"{figures.latency_before_ms:.3f} ms, faster in {ab.b_wins} of {ab.pairs} session pairs, "
        f"signed-rank p = {ab.p_value:.2g}{tested}): the original is {source.kept_as} ({override})")
    return Decision.NOT_FASTER


class PointVerdict(Enum):
    """The A/B's verdict at one profile point: measured faster, not slower (within the margin, asked of a simpler
    model only), or neither."""

    FASTER = "faster"
    NOT_SLOWER = "not-slower"
    SLOWER = "slower"


FASTER, NOT_SLOWER, SLOWER = PointVerdict.FASTER, PointVerdict.NOT_SLOWER, PointVerdict.SLOWER


def _verdict(ab: ABDecision) -> PointVerdict:
    if ab.b_is_faster():
        return FASTER
    return NOT_SLOWER if ab.b_is_not_slower() else SLOWER


def _point_feeds(source: Source, session: Any, point: Mapping[str, int], seed: int) -> dict[str, np.ndarray] | None:
    """Random inputs at a point, or None when the original does not run on them (a size the model cannot take)."""
    feeds = random_feeds(session, seed, source.shapes_at(point))
    try:
        session.run(None, dict(feeds))
    except Exception:  # noqa: BLE001 - ORT's own types: the original refuses this size
        return None
    return feeds


def check_other_sizes(source: Source, session: Any, candidate: Any, seed: int, figures: VerifyFigures) -> str | None:
    """Equivalence at the profile's other points and at one off-profile point (every symbol at a size the
    profile does not list, so a rewrite valid only at the measuring sizes cannot pass), against the original
    in float32 with the dtype's tolerance; what failed, in words, or None. Points the original cannot run at
    are skipped (the off-profile one tries another size first)."""
    plan = source.dynamic
    if plan is None:
        return None
    points = [(p, False) for p in plan.points()[1:]] + [(p, True) for p in plan.off_profile()]
    off_checked = False
    for point, off in points:
        if off and off_checked:
            break
        feeds = _point_feeds(source, session, point, seed)
        if feeds is None:
            continue
        label = plan.describe(point)
        try:
            check_equivalence(session, candidate, feeds, label,
                              lambda k, p=point: random_feeds(session, seed + k, source.shapes_at(p)))
        except EquivalenceError as exc:
            return f"the optimized model differs from the original at {label} ({exc.problem})"
        except NonFiniteReference:
            continue
        except Exception as exc:  # noqa: BLE001 - ORT refuses the optimized model at this size
            return f"ONNX Runtime cannot run the optimized model at {label} ({one_line(exc)})"
        figures.checked_at.append(label)
        off_checked = off_checked or off
    return None


def _ab(checked: Checked | None, first_pair: list[Any], feeds: Mapping[str, np.ndarray],
        fresh: Callable[[str], Any], margin: float | None) -> ABDecision:
    """``decide_ab`` of the original and the candidate on ``feeds``, starting from ``first_pair`` (their sessions,
    taken out of the list: where the caller holds them no longer, decide_ab releases them after the first pair);
    with ``checked.memo``, as the cost cache remembers it from an earlier run with these graphs, inputs and settings
    (else timed and remembered)."""
    def timed() -> ABDecision:
        return decide_ab(first_pair.pop(0), first_pair.pop(0), feeds, fresh, margin=margin)
    if checked is None or checked.memo is None or checked.chosen is None:
        return timed()
    return checked.memo.ab(checked.source.graph, checked.chosen.graph, feeds, margin, timed)


def time_other_points(source: Source, session: Any, candidate: Any, fresh: Callable[[str], Any], seed: int,
                      figures: VerifyFigures, margin: float | None = None,
                      first: PointVerdict = PointVerdict.FASTER, checked: Checked | None = None
                      ) -> dict[str, PointVerdict]:
    """The A/B at every profile point after the first, once the first found the optimized model faster (or not
    slower, ``first``, testing non-inferiority within ``margin``); recorded in ``figures.profile_points`` with the
    first. The verdict at each point (``FASTER``, ``NOT_SLOWER``, ``SLOWER``), by its label."""
    plan = source.dynamic
    if plan is None:
        return {}
    points = plan.points()
    figures.profile_points = [{"point": points[0], "latency_before_ms": figures.latency_before_ms,
                               "latency_after_ms": figures.latency_after_ms, "faster": first is FASTER,
                               "verdict": first.value}]
    verdicts: dict[str, PointVerdict] = {}
    for point in points[1:]:
        feeds = _point_feeds(source, session, point, seed)
        if feeds is None:
            continue
        ab = _ab(checked, [session, candidate], feeds, fresh, margin)
        verdicts[plan.describe(point)] = verdict = _verdict(ab)
        figures.profile_points.append({"point": point, "latency_before_ms": ab.a_median * 1e3,
                                       "latency_after_ms": ab.b_median * 1e3, "faster": verdict is FASTER,
                                       "verdict": verdict.value})
    return verdicts


def _time_original(original: OriginalRun | OriginalNotRunnable | None, checks: CheckSettings, source: Source,
                   say: Callable[[str], None], decision: Decision) -> Verified:
    """Nothing chosen: the original's own latency (when it runs and timing is on)."""
    verified = Verified(graph=None, decision=decision)
    if isinstance(original, OriginalNotRunnable):
        say(f"{original.problem}: not timed; the model is {source.kept_as}")
    elif original is not None and checks.measure:
        figures = verified.figures
        figures.latency_before_ms = figures.latency_after_ms = median_latency(original.session, original.feeds) * 1e3
        figures.speedup, figures.timed_runs = 1.0, 20
    return verified

"""The optimize pipeline: load, search, fold, check equivalence in ORT, measure A/B, write.

``optimize_file`` is what ``xflow optimize`` runs; ``optimize_model`` (and ``xflow.optimize``) does the
same for a ModelProto in memory, for pipelines."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx

from xflow.cost import AnalyticCost, GraphCoster
from xflow.cost.base import CostModel
from xflow.cost.cache import CostCache
from xflow.cost.measured import MeasuredCost, in_cache_batch_bytes
from xflow.errors import XflowError
from xflow.ir import Graph
from xflow.onnx_io import load, save, would_overwrite
from xflow.rewrite import fold_constants
from xflow.rewrite.simplify import Simplified, simplify_splits
from xflow.rules import Rule, default_rules_path, load_rules
from xflow.runtime import make_session, measure_ab, measure_interleaved, median_latency, random_feeds
from xflow.search import Alternative, SearchResult, backtracking_search, complete_sweeps
from xflow.search.backtrack import Step


class EquivalenceError(XflowError):
    """The optimized model computes something else than the original."""


@dataclass
class OptimizeOptions:
    """Everything a user can set for one optimization."""

    rules_path: str | None = None
    alpha: float = 1.05
    budget: int = 300
    patience: int | None = 10  # once improved, stop after this many expansions without a better graph
    alternatives: int = 2  # other first sweeps searched on; their best graphs are timed end to end
    time_limit: float = 60.0
    memory_limit: float | None = None  # MB of process RSS above which the search stops expanding
    provider: str = "cpu"
    threads: int | None = None
    cost: str = "measured"  # or "analytic"
    cost_db: str | None = None  # SQLite cost cache (default: under the user's cache folder)
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    inputs_npz: str | None = None
    seed: int = 0
    keep_if_slower: bool = False
    measure: bool = True
    verify: bool = True


@dataclass
class OptimizeReport:
    """Every figure of one run, as written by ``--report``."""

    input: str
    output: str
    rules_file: str
    rules_loaded: int
    nodes_before: int
    nodes_after: int
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    cost_model: str
    cost_before: float
    cost_after: float
    search_seconds: float
    search_stop: str
    graphs_explored: int
    graphs_generated: int
    cost_cache_lookups: int  # node costs asked for during the search (in-memory memo)
    cost_cache_hits: int
    rules_applied: dict[str, int]  # by rule id
    steps: list[dict[str, Any]]
    rule_names: dict[str, str] = field(default_factory=dict)  # readable name of each applied rule, by id
    verified: bool = False
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    latency_before_ms: float | None = None
    latency_after_ms: float | None = None
    speedup: float | None = None
    timed_runs: int = 0
    faster_rounds: int = 0  # interleaved rounds in which the optimized model ran faster
    sign_test_p: float | None = None  # one-sided sign test over those rounds (kept when < 0.01)
    decision: str = ""
    total_seconds: float = 0.0
    cost_db: str | None = None  # the SQLite cost cache used (measured costs only)
    cost_db_hits: int = 0  # node configurations found in it
    cost_db_misses: int = 0
    nodes_measured: int = 0  # node configurations measured in this run
    measure_sessions: int = 0  # ORT sessions built to measure them
    measure_seconds: float = 0.0
    nodes_not_measurable: int = 0  # costed analytically (dynamic shapes, subgraphs, refused by ORT)
    # the time each later measuring session's reference groups took over their time in the first (>1:
    # slower); its costs were divided by it (min and max over the run; empty with one session or none)
    session_scale: list[float] = field(default_factory=list)
    # graphs from different branches of the search timed end to end to choose the one written (when
    # there was more than one): estimated and measured ms, rewrites, nodes, which one was chosen
    finalists: list[dict[str, Any]] = field(default_factory=list)
    # after the search: nested splits folded into one, elementwise ops hoisted before a split
    splits_folded: int = 0
    elementwise_hoisted: int = 0
    channelwise_hoisted: int = 0
    splits_regridded: int = 0
    weights_permuted: int = 0
    nodes_opaque: int = 0  # nodes of the loaded model outside the algebra (opaque: carried, never rewritten)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def tolerance(dtype: np.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing outputs of rewritten models: reassociation changes rounding."""
    if dtype == np.float16:
        return 1e-2, 1e-2
    if dtype == np.float32:
        return 1e-3, 1e-4
    if dtype == np.float64:
        # Not tighter: ORT itself computes some double models with float32 constants (it fuses a scalar
        # Mul into FusedMatMul with a float32 alpha), so one side may be off by float32 rounding (~6e-8).
        return 1e-6, 1e-9
    return 0.0, 0.0


def compare_outputs(names: list[str], expected: list[np.ndarray], actual: list[np.ndarray]) -> dict[str, float]:
    """Max abs difference per output; EquivalenceError naming the first output out of tolerance."""
    diffs: dict[str, float] = {}
    for name, a, b in zip(names, expected, actual, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            raise EquivalenceError(None, f"output {name!r} changed from {a.dtype}{a.shape} to {b.dtype}{b.shape}")
        if a.size == 0:
            diffs[name] = 0.0
            continue
        if np.issubdtype(a.dtype, np.floating):
            if not np.array_equal(np.isnan(a), np.isnan(b)):
                raise EquivalenceError(None, f"output {name!r}: NaN positions differ")
            finite = ~np.isnan(a)
            diff = float(np.max(np.abs(a[finite].astype(np.float64) - b[finite]), initial=0.0))
            rtol, atol = tolerance(a.dtype)
            bound = atol + rtol * float(np.max(np.abs(a[finite]), initial=0.0))
            diffs[name] = diff
            if diff > bound:
                raise EquivalenceError(None, f"output {name!r} differs by {diff:.3g} (tolerance {bound:.3g})")
        else:
            if not np.array_equal(a, b):
                raise EquivalenceError(None, f"output {name!r} differs (integer/boolean values changed)")
            diffs[name] = 0.0
    return diffs


def _feeds(session, options: OptimizeOptions) -> dict[str, np.ndarray]:  # noqa: ANN001
    if options.inputs_npz:
        try:
            with np.load(options.inputs_npz) as data:
                return {k: data[k] for k in data.files}
        except (OSError, ValueError) as exc:
            raise XflowError(options.inputs_npz, f"cannot read inputs: {exc}") from None
    return random_feeds(session, options.seed, options.input_shapes)


class OriginalNotRunnable(XflowError):
    """ONNX Runtime cannot load or run the original model, so nothing can be verified or timed."""


def _original_session(in_path: str, options: OptimizeOptions) -> tuple[Any, dict[str, np.ndarray], list[Any]]:
    """The original model's ORT session, the inputs and its outputs on them; OriginalNotRunnable when ORT
    refuses the model (a custom-domain op without a kernel, an opset newer than ORT, inputs that random
    values cannot fill)."""
    try:
        session = make_session(in_path, options.provider, options.threads)
        feeds = _feeds(session, options)
        return session, feeds, session.run(None, feeds)
    except XflowError:
        raise
    except Exception as exc:  # ORT raises its own types (Fail, InvalidGraph, NotImplemented, ...)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if options.inputs_npz:  # the user's inputs do not fit the model: their error, not a pass-through
            raise XflowError(options.inputs_npz, f"ONNX Runtime cannot run {in_path} on these inputs "
                                                 f"({first[:300]})") from None
        raise OriginalNotRunnable(in_path, f"ONNX Runtime cannot run the model ({first[:300]})") from None


#: Alternatives estimated dearer than this times the best graph are not timed.
FINALIST_SPREAD = 1.5


@dataclass
class Finalist:
    """A graph the search ended with, folded and simplified, with its estimated cost and its path."""

    simplified: Simplified
    cost: float
    steps: tuple[Step, ...]
    completed: bool = False  # made by ``complete_sweeps`` from a search result


def _finalists(result: SearchResult, options: OptimizeOptions, coster: GraphCoster,
               rules: list[Rule]) -> list[Finalist]:
    """The best graph, then the other branches' best graphs within ``FINALIST_SPREAD`` of its cost
    (different graphs only), then each of those with the rules of its path applied at every match left
    (``complete_sweeps``), where that makes another graph."""
    best = Alternative(result.graph, result.best_cost, result.steps)
    if not options.measure:
        return [_finalist(best)]  # nothing will time the others
    sources = [best]
    seen = {result.graph.hash_sum}
    for alt in result.alternatives:
        if not alt.steps or alt.graph.hash_sum in seen or alt.cost > FINALIST_SPREAD * result.best_cost:
            continue
        seen.add(alt.graph.hash_sum)
        sources.append(alt)
    found = [_finalist(source) for source in sources]
    by_name = {rule.name: rule for rule in rules}
    for source in sources:
        path_rules = [by_name[name] for name in dict.fromkeys(s.rule for s in source.steps) if name in by_name]
        completed = complete_sweeps(source.graph, source.cost, path_rules, coster)
        if completed is None or completed.graph.hash_sum in seen or completed.cost > FINALIST_SPREAD * result.best_cost:
            continue
        seen.add(completed.graph.hash_sum)
        found.append(_finalist(Alternative(completed.graph, completed.cost, source.steps + completed.steps), True))
    return found


def _finalist(source: Alternative, completed: bool = False) -> Finalist:
    return Finalist(simplify_splits(fold_constants(source.graph)), source.cost, source.steps, completed)


@dataclass
class Picked:
    """Which finalist measured fastest end to end, and each one's median latency (s; None: ORT refused it)."""

    index: int
    medians: list[float | None]


def _pick_by_latency(finalists: list[Finalist], feeds: dict[str, np.ndarray], out_path: str,
                     options: OptimizeOptions, rounds: int = 7, seconds: float = 2.0) -> Picked:
    """Time the finalists end to end in interleaved rounds (``measure_interleaved``) on the original's
    inputs and pick the lowest median. The written model is then verified and timed against the
    original as any other; a finalist ORT cannot run is not timed (and the best one is still verified)."""
    scratch = tempfile.mkdtemp(prefix=".xflow-", dir=os.path.dirname(os.path.abspath(out_path)))
    try:
        sessions: dict[int, Any] = {}
        for i, finalist in enumerate(finalists):
            path = os.path.join(scratch, f"finalist{i}.onnx")
            try:
                save(finalist.simplified.graph, path)
                sessions[i] = make_session(path, options.provider, options.threads)
                sessions[i].run(None, dict(feeds))
            except Exception:  # noqa: BLE001 - one that does not run is not chosen
                sessions.pop(i, None)
            finally:  # the session holds its weights now: a large model's finalists need not all be on disk
                for leftover in (path, path + ".data"):
                    with contextlib.suppress(OSError):
                        os.remove(leftover)
        if not sessions:
            return Picked(0, [None] * len(finalists))
        timed, _ = measure_interleaved(sessions, feeds, rounds, seconds)
        medians: list[float | None] = [timed.get(i) for i in range(len(finalists))]
        return Picked(min(timed, key=timed.__getitem__), medians)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def check_output_path(in_path: str, out_path: str) -> None:
    """Refuse IN == OUT and outputs that cannot be written, before any work is done."""
    if os.path.abspath(in_path) == os.path.abspath(out_path) or (
            os.path.exists(out_path) and os.path.samefile(in_path, out_path)):
        raise XflowError(out_path, "output is the input file; choose another output path")
    directory = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(directory):
        raise XflowError(out_path, "output directory does not exist")
    if not os.access(directory, os.W_OK):
        raise XflowError(out_path, "output directory is not writable")
    if os.path.isdir(out_path):
        raise XflowError(out_path, "output is a directory")


def make_cost_model(options: OptimizeOptions, graph: Graph | None = None) -> CostModel:
    """The cost model the options ask for; opens (or creates) the cost cache for measured costs. With
    ``graph``, a model whose weights fit in the CPU's last-level cache is measured in the cache."""
    if options.cost == "analytic":
        return AnalyticCost()
    if options.cost != "measured":
        raise XflowError(None, f"unknown cost model {options.cost!r}; choose measured or analytic")
    batch_bytes = in_cache_batch_bytes(graph, options.provider) if graph is not None else None
    return MeasuredCost(options.provider, options.threads, CostCache(options.cost_db), batch_bytes=batch_bytes)


def _cost_figures(report: OptimizeReport, model: CostModel) -> None:
    if not isinstance(model, MeasuredCost):
        return
    stats = model.stats
    report.cost_db = str(model.cache.path) if model.cache is not None else None
    report.cost_db_hits, report.cost_db_misses = stats.cache_hits, stats.cache_misses
    report.nodes_measured, report.measure_sessions = stats.measured, stats.sessions
    report.measure_seconds = stats.seconds
    report.nodes_not_measurable = stats.fallback + stats.failed
    if stats.session_factors:
        report.session_scale = [min(stats.session_factors), max(stats.session_factors)]


def optimize_file(in_path: str, out_path: str, options: OptimizeOptions, cost_model: CostModel | None = None,
                  say: Callable[[str], None] = print,
                  progress: Callable[[SearchResult], None] | None = None) -> OptimizeReport:
    """Optimize ``in_path`` into ``out_path``; the written model is verified equal and never slower
    (unless ``keep_if_slower``). Raises XflowError for bad input; writes nothing on failure."""
    started = time.perf_counter()
    check_output_path(in_path, out_path)
    graph = load(in_path, options.input_shapes)
    clash = would_overwrite(graph, out_path)
    if clash is not None:
        raise XflowError(out_path, f"writing it would replace {clash}, which holds the input's weights; "
                                   "choose another output path")
    rules_file = options.rules_path or str(default_rules_path())
    rules: list[Rule] = load_rules(options.rules_path)
    coster = GraphCoster(cost_model or make_cost_model(options, graph))
    if rules:
        result = backtracking_search(graph, rules, coster, options.alpha, options.budget, options.time_limit,
                                     progress=progress, memory_limit_mb=options.memory_limit,
                                     patience=options.patience, branches=options.alternatives)
    else:  # nothing to search: do not measure every node of the model for a cost nobody compares
        result = SearchResult(graph, 0.0, 0.0, (), "no-rules", 0, 0, 0.0)
    finalists = _finalists(result, options, coster, rules) if result.steps else []
    picked: Picked | None = None
    original_run = None  # the original's session, inputs and outputs, made once for the timing and the check
    if len(finalists) > 1:
        try:
            original_run = _original_session(in_path, options)
        except OriginalNotRunnable:
            pass  # nothing can be timed; _verify_measure_write says so and writes the original
        else:
            picked = _pick_by_latency(finalists, original_run[1], out_path, options)
    chosen = finalists[picked.index if picked is not None else 0] if finalists else None
    simplified = chosen.simplified if chosen is not None else None
    optimized = simplified.graph if simplified is not None else graph
    steps = chosen.steps if chosen is not None else ()
    report = OptimizeReport(
        input=in_path, output=out_path, rules_file=rules_file, rules_loaded=len(rules),
        nodes_before=len(graph.nodes), nodes_after=len(optimized.nodes), nodes_opaque=graph.opaque_count(),
        ops_before=graph.op_counts(),
        ops_after=optimized.op_counts(), cost_model=coster.model.name, cost_before=result.initial_cost,
        cost_after=chosen.cost if chosen is not None else result.best_cost, search_seconds=result.seconds,
        search_stop=result.stop_reason, graphs_explored=result.explored, graphs_generated=result.generated,
        cost_cache_lookups=result.cost_lookups, cost_cache_hits=result.cost_hits,
        rules_applied=dict(Counter(s.rule for s in steps)),
        steps=[{"rule": s.rule, "nodes": list(s.nodes)} for s in steps],
        rule_names={r.name: r.readable_name for r in rules if r.name in {s.rule for s in steps}})
    if picked is not None:
        report.finalists = [{"estimated_ms": f.cost * 1e3, "rewrites": len(f.steps),
                             "nodes": len(f.simplified.graph.nodes),
                             "measured_ms": (picked.medians[i] * 1e3 if picked.medians[i] is not None else None),
                             "chosen": i == picked.index, "completed": f.completed}
                            for i, f in enumerate(finalists)]
    _cost_figures(report, coster.model)
    if simplified is not None:
        report.splits_folded, report.elementwise_hoisted = simplified.nested_splits, simplified.elementwise_hoisted
        report.splits_regridded, report.weights_permuted = simplified.regridded, simplified.weights_permuted
        report.channelwise_hoisted = simplified.channelwise_hoisted
    if not rules:
        say(f"no rules in {rules_file}: the model is copied through unchanged")
        report.decision = "copied (no rules)"
    elif not steps:
        say(f"no rewrite lowers the cost ({len(rules)} rules, {result.explored} graphs explored): "
            "the model is copied through unchanged")
        report.decision = "copied (no improving rewrite)"
    if not steps:
        save(graph, out_path)
        if options.measure:
            try:
                session, feeds, _ = _original_session(in_path, options)
            except OriginalNotRunnable as exc:
                say(f"{exc.problem}: not timed; the model is copied through unchanged")
            else:
                report.latency_before_ms = report.latency_after_ms = median_latency(session, feeds) * 1e3
                report.speedup, report.timed_runs = 1.0, 20
        report.total_seconds = time.perf_counter() - started
        return report
    _verify_measure_write(graph, optimized, in_path, out_path, options, report, say, original_run)
    report.total_seconds = time.perf_counter() - started
    return report


def _verify_measure_write(original: Graph, optimized: Graph, in_path: str, out_path: str,
                          options: OptimizeOptions, report: OptimizeReport, say: Callable[[str], None],
                          original_run: tuple[Any, dict[str, np.ndarray], list[Any]] | None = None) -> None:
    if not options.verify and not options.measure:  # nothing to run in ORT (and no weights to load there)
        save(optimized, out_path)
        report.decision = "optimized"
        return
    try:
        session_a, feeds, expected = original_run or _original_session(in_path, options)
    except OriginalNotRunnable as exc:
        say(f"{exc.problem}: the rewrites cannot be verified, so the model is copied through unchanged")
        save(original, out_path)
        report.decision = "copied (ONNX Runtime cannot run the model)"
        return
    scratch = tempfile.mkdtemp(prefix=".xflow-", dir=os.path.dirname(os.path.abspath(out_path)))
    try:
        candidate_path = os.path.join(scratch, "candidate.onnx")
        try:
            save(optimized, candidate_path)
        except XflowError as exc:  # name the user's output, not the scratch file beside it
            raise XflowError(out_path, f"{exc.problem} (writing the model to verify beside it)") from None
        try:
            session_b = make_session(candidate_path, options.provider, options.threads)
            actual = session_b.run(None, feeds)
        except Exception as exc:  # noqa: BLE001 - any ORT refusal of our output is reported the same way
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise EquivalenceError(in_path, f"ONNX Runtime cannot run the optimized model, nothing written: "
                                            f"{first[:300]}") from None
        names = [o.name for o in session_a.get_outputs()]
        if options.verify:
            try:
                report.max_abs_diff = compare_outputs(names, expected, actual)
            except EquivalenceError as exc:
                raise EquivalenceError(in_path, f"optimized model is not equivalent, nothing written: {exc.problem}") \
                    from None
            report.verified = True
        keep_optimized = True
        if options.measure:
            ab = measure_ab(session_a, session_b, feeds)
            report.latency_before_ms, report.latency_after_ms = ab.a_median * 1e3, ab.b_median * 1e3
            report.speedup, report.timed_runs = ab.speedup, ab.runs
            report.faster_rounds, report.sign_test_p = ab.b_wins, ab.p_value
            # "Faster" must be more than one lucky median: BERT's merges measured 1.05x in optimize's
            # A/B and 0.96x in the bench's longer run. The sign test asks it of most rounds.
            keep_optimized = ab.b_is_faster() or options.keep_if_slower
        if keep_optimized:
            save(optimized, out_path)
            report.decision = "optimized"
        else:
            save(original, out_path)
            report.decision = "copied (optimized model was not faster)"
            say(f"the optimized model was not measurably faster ({report.latency_after_ms:.3f} ms vs "
                f"{report.latency_before_ms:.3f} ms, faster in {ab.b_wins} of {ab.runs} interleaved rounds, "
                f"sign test p = {ab.p_value:.2g}): wrote the original (use --keep-if-slower to override)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def optimize_model(model: onnx.ModelProto | str, options: OptimizeOptions) -> tuple[onnx.ModelProto, OptimizeReport]:
    """Optimize a model in memory (or a file) and return the result with its report: the same checks
    as ``optimize_file`` (verified; the original comes back when the optimized one is not faster)."""
    with tempfile.TemporaryDirectory(prefix="xflow-") as folder:
        if isinstance(model, onnx.ModelProto):
            in_path = os.path.join(folder, "in.onnx")
            onnx.save(model, in_path)
        else:
            in_path = os.fspath(model)
        out_path = os.path.join(folder, "out.onnx")
        report = optimize_file(in_path, out_path, options, say=lambda _m: None)
        result = onnx.load(out_path)  # external data, if any, is read in before the folder goes
    report.input = in_path if not isinstance(model, onnx.ModelProto) else "<ModelProto>"
    report.output = "<ModelProto>"
    return result, report


def optimize(model: onnx.ModelProto | str, **options: Any) -> onnx.ModelProto:
    """Optimize an ONNX model (a ModelProto or a path) and return the optimized ModelProto.

    Keyword options are the fields of ``OptimizeOptions`` (``rules_path``, ``alpha``, ``budget``,
    ``time_limit``, ``provider``, ``threads``, ``cost``, ``cost_db``, ``input_shapes``, ``seed``,
    ``keep_if_slower``, ...). Raises XflowError (EquivalenceError on a mismatch) as the CLI would."""
    known = {f.name for f in dataclasses.fields(OptimizeOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return optimize_model(model, OptimizeOptions(**options))[0]

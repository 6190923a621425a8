"""The optimize pipeline, a chain of stages over in-memory graphs and models:

load -> search -> finalize (complete, fold, simplify) -> select (time the finalists end to end) ->
verify (outputs in ORT, then the A/B timing that decides) -> place (optional) -> write.

Each stage takes what the previous one returns and reports its own figures; ``OptimizeReport`` is
assembled from them in one place. Models go to ONNX Runtime from memory (a scratch file in the run's
folder only for models whose weights are external or too large for one protobuf), and nothing is
written until every stage has succeeded. ``optimize_file`` is what ``xflow optimize`` runs;
``optimize_model`` (and ``xflow.optimize``) runs the same chain on a ModelProto and returns one."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx

from xflow.cost import AnalyticCost, GraphCoster
from xflow.cost.base import CostModel
from xflow.cost.cache import CostCache
from xflow.cost.measured import MeasuredCost, in_cache_batch_bytes
from xflow.equivalence import EquivalenceError, NonFiniteReference, check_equivalence, verify_against_original
from xflow.errors import XflowError, one_line
from xflow.files import (
    all_or_none,
    check_distinct,
    check_output_file,
    copy_atomically,
    keep_private,
    run_folder,
    same_folder,
    write_json,
)
from xflow.ir import Graph
from xflow.ir.dims import is_static
from xflow.onnx_io import graph_from_model, read_model, save, to_model_proto, would_overwrite
from xflow.onnx_io.load import check_input_shapes, check_proto, model_from_bytes
from xflow.onnx_io.profile import ShapePlan, shape_plan
from xflow.onnx_io.save import EXTERNAL_THRESHOLD, weight_files
from xflow.onnx_io.shared_weights import SharedWeightsFiles, weights_in_memory, write_sharing_weights
from xflow.rewrite import Match, find_matches, fold_constants
from xflow.rewrite.simplify import Simplified, simplify_splits
from xflow.rules import Rule, default_rules_path, load_rules
from xflow.rules.proof import refuse_stale_proofs
from xflow.runtime import decide_ab, interleaved_times, make_session, median_latency, random_feeds
from xflow.search import Alternative, SearchLimits, SearchReport, Step, StopReason, backtracking_search, complete_sweeps
from xflow.search.profile_cost import ProfileCost, graph_at


@dataclass
class OptimizeOptions:
    """Everything a user can set for one optimization."""

    rules_path: str | None = None
    rules: Sequence[Rule] | None = None  # the rules already loaded (and proved) by the caller; rules_path names them
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
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # measuring shapes only
    shape_profile: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # symbol -> sizes (onnx_io.profile)
    inputs_npz: str | None = None
    seed: int = 0
    keep_if_slower: bool = False
    measure: bool = True
    verify: bool = True


@dataclass
class VerifyFigures:
    """The verify stage's figures, the A/B timing's included (the report carries them as they are)."""

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
    rank_test_p: float | None = None  # one-sided signed-rank test over the pairs (written when < 0.01)
    # dynamic models: the A/B at each profile point (the figures above are the first point's), and the
    # points equivalence was checked at besides the first (profile points and an off-profile one)
    profile_points: list[dict[str, Any]] = field(default_factory=list)
    checked_at: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class OptimizeReport(VerifyFigures):
    """Every figure of one run, as written by ``--report``."""

    input: str
    output: str
    rules_file: str
    rules_loaded: int
    nodes_before: int  # ONNX nodes of the input model
    nodes_after: int  # ONNX nodes of the model written (returned)
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
    # nodes of the IR before and after (a Gemm is a matmul and an add there, a fused Conv+Relu two nodes)
    ir_nodes_before: int = 0
    ir_nodes_after: int = 0
    nodes_opaque: int = 0  # nodes of the loaded model outside the algebra (opaque: carried, never rewritten)
    nodes_opaque_computing: int = 0  # of those, the ones computing at run time (no Constant, no folded shape node)
    copied: bool = False  # the model written is a byte-for-byte copy of the input
    # values a rule whose gain is in the values bound that held float32/64 denormals on the check inputs
    values_with_denormals: list[str] = field(default_factory=list)
    plan_output: str | None = None  # --place: the plan written, the placement chosen and its step time
    placement_chosen: str | None = None
    placement_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def read_inputs(path: str) -> dict[str, np.ndarray]:
    """The named arrays of an .npz file (``--inputs``); XflowError naming the file when it is not one."""
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise XflowError(path, "no such file") from None
    except IsADirectoryError:
        raise XflowError(path, "is a directory, not an .npz file of input arrays") from None
    except OSError as exc:
        raise XflowError(path, f"cannot read inputs: {exc.strerror or exc}") from None
    except ValueError:  # numpy's own words for a file it cannot parse speak of pickles
        raise XflowError(path, "not an .npz file of input arrays (numpy cannot read it)") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise XflowError(path, "holds one unnamed array (.npy); give an .npz that names each input "
                               "(numpy.savez(path, x=...))")
    try:
        with data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise XflowError(path, f"cannot read inputs: {one_line(exc)}") from None


class OriginalNotRunnable(XflowError):
    """ONNX Runtime cannot load or run the original model, so nothing can be verified or timed."""


@dataclass
class Source:
    """The model to optimize: its graph, and the original as ONNX Runtime and the writer reach it (a file,
    or a ModelProto in memory)."""

    graph: Graph
    label: str  # how messages and the report name it
    path: str | None = None
    proto: onnx.ModelProto | None = None
    onnx_nodes: int = 0  # nodes of the ONNX model (the IR may count them differently)
    shapes: ShapePlan | None = None  # the model's dynamic dims and the sizes it is measured and checked at
    measuring: dict[str, tuple[int, ...]] = field(default_factory=dict)  # input shapes the graph was built at

    def shapes_at(self, point: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """Input shapes at a profile point (``--input-shape`` where it gives them)."""
        shapes = self.shapes.shapes_at(point) if self.shapes is not None else {}
        return {**shapes, **{k: v for k, v in self.measuring.items() if k not in shapes}}

    @property
    def runnable(self) -> str | onnx.ModelProto:
        """What ONNX Runtime opens for the original: its file when there is one, else the ModelProto."""
        return self.path if self.path is not None else self.proto

    @property
    def copyable(self) -> bool:
        """True when writing the original means copying its file byte for byte (its weights are in it)."""
        return self.path is not None and not (self.graph.context is not None and self.graph.context.external_data)

    @property
    def kept_as(self) -> str:
        """How the original is written when it is kept, in words."""
        return "copied through unchanged" if self.copyable or self.path is None else \
            "written unchanged (re-encoded: its weights are external data)"


def load_source(model: onnx.ModelProto | bytes | str, options: OptimizeOptions) -> Source:
    """The load stage: parse and check the model, resolve its shape profile, build its graph with the
    model's own dims (dynamic ones as symbols: the search decides rule conditions for every size and costs
    graphs at the profile's points); ``measuring`` are the input shapes at the profile's first point."""
    if isinstance(model, (bytes, bytearray, memoryview)):  # serialized: parsed here, named as what it is
        model = model_from_bytes(model)
    if isinstance(model, onnx.ModelProto):
        check_proto(model, "<ModelProto>")
        label, path, proto, base_dir = "<ModelProto>", None, model, ""
    else:
        path = os.fspath(model)
        label, proto, base_dir = path, read_model(path), os.path.dirname(os.path.abspath(path))
    plan = shape_plan(proto, options.shape_profile, options.input_shapes, label)
    given = dict(options.input_shapes)
    if options.inputs_npz and plan.is_dynamic and not given and not options.shape_profile:
        given = _npz_shapes(plan, read_inputs(options.inputs_npz))  # measured at the user's inputs' shapes
        plan = shape_plan(proto, {}, given, label)
    measuring = {**plan.shapes_at(plan.points()[0]), **given}
    check_input_shapes(proto, given, label)
    # an input of unknown rank has no symbols to size: --input-shape gives it its shape
    unranked = {name: shape for name, shape in given.items() if plan.input_dims.get(name) is None}
    graph = graph_from_model(proto, base_dir, path or "", unranked)
    return Source(graph, label, path, model if path is None else None, len(proto.graph.node), plan, measuring)


def _npz_shapes(plan: ShapePlan, arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """The shapes of the ``--inputs`` arrays that fit a dynamic input (rank and fixed dims; the others are
    left for the original's run to refuse, with ONNX Runtime's words)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name, array in arrays.items():
        dims = plan.input_dims.get(name)
        if dims is None or len(dims) != array.ndim or all(is_static(d) for d in dims):
            continue
        if all(not is_static(d) or int(d) == n for d, n in zip(dims, array.shape, strict=True)):
            shapes[name] = tuple(array.shape)
    return shapes


@dataclass
class OriginalRun:
    """The original model's ORT session, the inputs and its outputs on them (made once per run)."""

    session: Any
    feeds: dict[str, np.ndarray]
    outputs: list[Any]


def run_original(source: Source, options: OptimizeOptions) -> OriginalRun:
    """Run the original on the inputs; OriginalNotRunnable when ORT refuses the model (a custom-domain op
    without a kernel, an opset newer than ORT, inputs that random values cannot fill), XflowError naming
    ``--inputs`` when the user's inputs do not fit it."""
    try:
        session = make_session(source.runnable, options.provider, options.threads)
        feeds = read_inputs(options.inputs_npz) if options.inputs_npz else \
            random_feeds(session, options.seed, source.measuring)
        return OriginalRun(session, feeds, session.run(None, feeds))
    except XflowError:
        raise
    except Exception as exc:  # ORT raises its own types (Fail, InvalidGraph, NotImplemented, ...)
        if options.inputs_npz:  # the user's inputs do not fit the model: their error, not a pass-through
            raise XflowError(options.inputs_npz, f"ONNX Runtime cannot run {source.label} on these inputs: "
                                                 f"{one_line(exc)}") from None
        plan = source.shapes
        where = f" at {plan.describe(plan.points()[0])}; --shape-profile sets other sizes" \
            if plan is not None and plan.is_dynamic else ""
        raise OriginalNotRunnable(source.label, f"ONNX Runtime cannot run the model{where} ({one_line(exc)})") \
            from None


def _fits_in_memory(graph: Graph) -> bool:
    """True when the graph's model can go to ORT as bytes: its weights are inline and one protobuf holds them."""
    return weights_in_memory(graph) and sum(c.nbytes for c in graph.constants.values()) < EXTERNAL_THRESHOLD


def session_maker(graph: Graph, options: OptimizeOptions, scratch: str, name: str) -> Callable[[], Any]:
    """A maker of ORT sessions of ``graph`` (the A/B and the select stage make several of one graph): from its
    model serialized once, or (external or very large weights) from a file written in ``scratch`` for each
    session and removed once the session holds the weights."""
    if _fits_in_memory(graph):
        serialized = to_model_proto(graph).SerializeToString()
        return lambda: make_session(serialized, options.provider, options.threads)

    def from_file() -> Any:
        path = os.path.join(scratch, f"{name}.onnx")
        try:
            save(graph, path, scratch=scratch)
            return make_session(path, options.provider, options.threads)
        finally:
            for leftover in (path, path + ".data"):
                with contextlib.suppress(OSError):
                    os.remove(leftover)
    return from_file


def fresh_sessions(source: Source, make_optimized: Callable[[], Any], options: OptimizeOptions) -> Callable[[str], Any]:
    """``decide_ab``'s maker of fresh sessions: "a" the original, "b" the optimized graph."""
    def make(side: str) -> Any:
        if side == "a":
            return make_session(source.runnable, options.provider, options.threads)
        return make_optimized()
    return make


# ---- search ------------------------------------------------------------------------------------------


def search_limits(options: OptimizeOptions) -> SearchLimits:
    """The search's limits as the options set them."""
    return SearchLimits(alpha=options.alpha, budget=options.budget, time_limit=options.time_limit,
                        memory_limit_mb=options.memory_limit, patience=options.patience,
                        branches=options.alternatives)


def search(graph: Graph, rules: list[Rule], coster: GraphCoster, options: OptimizeOptions,
           progress: Callable[[SearchReport], None] | None = None) -> SearchReport:
    """The search stage (with no rules, nothing is searched nor costed: nobody would compare the cost)."""
    if not rules:
        return SearchReport(graph, 0.0, 0.0, (), StopReason.NO_RULES, 0, 0, 0.0)
    return backtracking_search(graph, rules, coster, search_limits(options), progress)


#: Which of the named values of a graph hold denormals when it runs on the original's inputs (None: not known).
DenormalProbe = Callable[[Graph, Sequence[str]], "frozenset[str] | None"]


def denormal_values(graph: Graph, names: Sequence[str], feeds: Mapping[str, np.ndarray], options: OptimizeOptions,
                    scratch: str) -> frozenset[str] | None:
    """Which of ``names`` (float values of ``graph``) hold a denormal (a nonzero element below its type's smallest
    normal) when ``graph`` runs on ``feeds``: inputs and constants read as they are, the others from one ORT session
    of the graph with them as outputs too. None when that cannot be run (weights in external data, or ORT refuses):
    then nothing is known."""
    wanted = [n for n in dict.fromkeys(names) if (t := graph.types.get(n)) is not None and _is_float(t.dtype)]
    known = {n: feeds[n] if n in feeds else graph.constants[n].value() for n in wanted
             if n in feeds or n in graph.constants}
    computed = [n for n in wanted if n not in known]
    if computed:
        if not _fits_in_memory(graph):
            return None  # written to a file for ORT (external or very large weights): not probed
        model = to_model_proto(graph)
        model.graph.output.extend(onnx.helper.make_tensor_value_info(n, graph.types[n].dtype, None)
                                  for n in computed if n not in graph.outputs)
        try:
            session = make_session(model.SerializeToString(), options.provider, options.threads)
            known |= dict(zip(computed, session.run(computed, dict(feeds)), strict=True))
        except Exception:  # noqa: BLE001 - ORT's own types: unknown, so every match is kept
            return None
    return frozenset(n for n, v in known.items() if _holds_denormals(np.asarray(v)))


def _is_float(dtype: int) -> bool:
    try:
        return bool(np.issubdtype(onnx.helper.tensor_dtype_to_np_dtype(dtype), np.floating))
    except (KeyError, TypeError, ValueError):  # undefined or not a numpy type
        return False


def _holds_denormals(array: np.ndarray) -> bool:
    magnitude = np.abs(array)
    return bool(((magnitude > 0) & (magnitude < np.finfo(array.dtype).tiny)).any())


# ---- finalize ----------------------------------------------------------------------------------------

#: Alternatives estimated dearer than this times the best graph are not timed.
FINALIST_SPREAD = 1.5
#: The cheapest first sweeps from the input graph (each cheaper than the input by the estimate), each timed as it
#: is and applied to the best graph: the measured cost model sums kernels measured apart and misses by about as
#: much what a rewrite changes in the whole run (on BERT-base, a Linear bias given a leading unit axis looks a
#: wash at the matches the search takes and runs 2.5% faster at all of them).
ROOT_SWEEP_FINALISTS = 4


@dataclass
class Finalist:
    """A graph the search ended with, folded and simplified, with its estimated cost and its path."""

    simplified: Simplified
    cost: float
    steps: tuple[Step, ...]
    completed: bool = False  # made by ``complete_sweeps`` from a search result


def finalize(result: SearchReport, options: OptimizeOptions, coster: GraphCoster, rules: list[Rule],
             probe: DenormalProbe | None = None) -> list[Finalist]:
    """The finalize stage: the best graph, then the other branches' best graphs within ``FINALIST_SPREAD``
    of its cost (different graphs only), the cheapest first sweeps from the input alone and applied to the
    best graph (``ROOT_SWEEP_FINALISTS``), then each branch's graph
    with the rules of its path applied at every match left (``complete_sweeps``), where that makes another
    graph; and the best graph (the input, where the search found no rewrite) with each rule whose saving is in the
    values applied at every match whose values ``probe`` finds denormal (every match without a probe;
    ``_value_sweep``); each folded and simplified. None when nothing is left."""
    lifting = [rule for rule in rules if rule.gain_in_values] if options.measure else []
    if not result.steps:
        lifted = _value_sweep(Alternative(result.graph, result.best_cost, ()), lifting, coster, probe)
        return [_finalist(lifted, True)] if lifted is not None else []
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
    # each first sweep from the input alone (one rule at every match): a rule whose measured gain is real
    # end to end stays separable from one whose estimated gain is not, when the search's best graph mixes
    # the two (an Add -> Sum that escapes a slow ORT fusion beside matmul merges the estimate flatters)
    by_name = {rule.name: rule for rule in rules}
    taken = [sweep for sweep in sorted(result.root_sweeps, key=lambda alt: alt.cost)
             if sweep.graph.hash_sum not in seen and sweep.cost < result.initial_cost
             and sweep.cost <= FINALIST_SPREAD * result.best_cost][:ROOT_SWEEP_FINALISTS]
    for sweep in taken:
        seen.add(sweep.graph.hash_sum)
        found.append(_finalist(sweep))
    # ... and the best graph with each such sweep's rule applied at every match left: the two gains, when
    # both are real, add up end to end
    best_rules = {s.rule for s in best.steps}
    for sweep in taken:
        extra = [by_name[name] for name in dict.fromkeys(s.rule for s in sweep.steps)
                 if name in by_name and name not in best_rules]
        combined = complete_sweeps(best.graph, best.cost, extra, coster) if extra else None
        if combined is None or combined.graph.hash_sum in seen:
            continue
        seen.add(combined.graph.hash_sum)
        found.append(_finalist(Alternative(combined.graph, combined.cost, best.steps + combined.steps), True))
    for source in sources:
        path_rules = [by_name[name] for name in dict.fromkeys(s.rule for s in source.steps) if name in by_name]
        completed = complete_sweeps(source.graph, source.cost, path_rules, coster)
        if completed is None or completed.graph.hash_sum in seen or completed.cost > FINALIST_SPREAD * result.best_cost:
            continue
        seen.add(completed.graph.hash_sum)
        found.append(_finalist(Alternative(completed.graph, completed.cost, source.steps + completed.steps), True))
    lifted = _value_sweep(best, lifting, coster, probe)
    if lifted is not None and lifted.graph.hash_sum not in seen:
        found.append(_finalist(lifted, True))
    return found


def _value_sweep(source: Alternative, rules: list[Rule], coster: GraphCoster,
                 probe: DenormalProbe | None = None) -> Alternative | None:
    """``source`` with each rule whose saving is in the values (``Rule.gain_in_values``) applied at every match
    whose values are of the rule's ``value_dtypes`` (the op table's) and one of which holds denormals (``probe``;
    any, when it cannot tell), whatever the estimate says (costs measured on random inputs cannot see that saving;
    the end-to-end timing of the finalists can); None when none applies."""
    if not rules:
        return None
    types = source.graph.types
    held: frozenset[str] | None = None
    if probe is not None:
        bound = [value for rule in rules for match in find_matches(source.graph, rule)
                 for value in match.values.values()]
        held = probe(source.graph, bound) if bound else frozenset()

    def keep(match: Match) -> bool:
        values = match.values.values()
        return all(types[v].dtype in match.rule.value_dtypes for v in values if v in types) and \
            (held is None or any(v in held for v in values))

    swept = complete_sweeps(source.graph, source.cost, rules, coster, rounds=1, min_matches=1, keep=keep)
    return Alternative(swept.graph, swept.cost, source.steps + swept.steps) if swept is not None else None


def _finalist(source: Alternative, completed: bool = False) -> Finalist:
    return Finalist(simplify_splits(fold_constants(source.graph)), source.cost, source.steps, completed)


# ---- select ------------------------------------------------------------------------------------------


@dataclass
class Picked:
    """Which finalist measured fastest end to end, and each one's median latency (s; None: ORT refused it)."""

    index: int
    medians: list[float | None]


def select_by_latency(finalists: list[Finalist], feeds: dict[str, np.ndarray], options: OptimizeOptions,
                      scratch: str, rounds: int = 7, seconds: float = 2.0) -> Picked:
    """The select stage: time the finalists end to end in interleaved rounds (``interleaved_times``) on the
    original's inputs and pick the fastest, by successive halving: after each stage of at least ``rounds``
    rounds and about ``seconds``, the slower half is dropped and the rest timed again on fresh sessions, until
    two are left and each has been timed on two sessions. The finalists worth telling apart are often within
    2-3% of each other, which is about what one session's luck (where its buffers land, for its whole life) moves
    a model; so a finalist's figure is the median over its sessions of each session's median, and every stage
    draws that luck again. The chosen one is then verified and timed against the original as any other; a
    finalist ORT cannot run is not timed (and the best one is still verified)."""
    graphs = [finalist.simplified.graph for finalist in finalists]
    shared = None
    if all(weights_in_memory(g) for g in graphs):
        with contextlib.suppress(OSError):  # no room for the files: each session from bytes, as below
            shared = write_sharing_weights(graphs, scratch, "finalist")
    try:
        return _time_finalists(graphs, shared, feeds, options, scratch, rounds, seconds)
    finally:
        if shared is not None:
            shared.remove()


def _time_finalists(graphs: list[Graph], shared: SharedWeightsFiles | None, feeds: dict[str, np.ndarray],
                    options: OptimizeOptions, scratch: str, rounds: int, seconds: float) -> Picked:
    """``select_by_latency``'s successive halving, its sessions made from ``shared``'s files where written."""
    makers: dict[int, Callable[[], Any]] = {}
    sessions: dict[int, Any] = {}
    for i, graph in enumerate(graphs):
        try:
            makers[i] = functools.partial(make_session, shared.model_paths[i], options.provider, options.threads) \
                if shared is not None else session_maker(graph, options, scratch, f"finalist{i}")
            sessions[i] = makers[i]()
            sessions[i].run(None, dict(feeds))
        except Exception:  # noqa: BLE001 - one that does not run is not chosen
            sessions.pop(i, None)
    if not sessions:
        return Picked(0, [None] * len(graphs))
    session_medians: dict[int, list[float]] = {i: [] for i in sessions}

    def figure(i: int) -> float:
        return statistics.median(session_medians[i])

    alive = list(sessions)
    while True:
        timed, _ = interleaved_times({i: sessions[i] for i in alive}, feeds, rounds, seconds)
        for i, values in timed.items():
            session_medians[i].append(statistics.median(values))
        if len(alive) <= 2 and all(len(session_medians[i]) >= 2 for i in alive) or len(alive) == 1:
            break
        alive = sorted(alive, key=figure)[:max(2, (len(alive) + 1) // 2)]
        for i in list(sessions):
            del sessions[i]  # released before its fresh one is made: one model's weights fewer at a time
            if i not in alive:
                del makers[i]
        for i in alive:
            sessions[i] = makers[i]()  # a fresh draw of the session's luck
    medians: list[float | None] = [figure(i) if i in session_medians else None for i in range(len(graphs))]
    return Picked(min(alive, key=figure), medians)


# ---- verify ------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    """What the verify stage found: the optimized graph to write (None: the original), why, and its figures."""

    graph: Graph | None
    reason: str  # "optimized", or why the original is written
    figures: VerifyFigures = field(default_factory=VerifyFigures)


def verify(optimized: Graph | None, original: OriginalRun | OriginalNotRunnable | None, options: OptimizeOptions,
           scratch: str, source: Source, say: Callable[[str], None], output_label: str = "") -> Verdict:
    """The verify stage: run the optimized graph on the original's inputs, compare the outputs
    (EquivalenceError when they differ or ORT refuses it), time both (interleaved) and keep the optimized
    one only when it is faster over pairs of fresh sessions (``decide_ab``; or ``keep_if_slower``). With no optimized
    graph, only the original's latency is measured."""
    if optimized is None:
        return _time_original(original, options, source, say)
    if not options.verify and not options.measure:  # nothing to run in ORT (and no weights to load there)
        return Verdict(optimized, "optimized")
    if isinstance(original, OriginalNotRunnable) or original is None:
        problem = original.problem if original is not None else "the original was not run"
        say(f"{problem}: the rewrites cannot be verified, so the model is {source.kept_as}")
        return Verdict(None, "ONNX Runtime cannot run the model")
    try:
        make_candidate = session_maker(optimized, options, scratch, "candidate")
        candidate = make_candidate()
        candidate.run(None, original.feeds)  # ORT runs it at all: refused here, said below
    except XflowError as exc:  # the scratch file could not be written: name the output, not the scratch path
        raise XflowError(output_label or source.label, f"{exc.problem} (writing the model to verify beside it)") \
            from None
    except Exception as exc:  # noqa: BLE001 - any ORT refusal of our output is reported the same way
        raise EquivalenceError(source.label, f"ONNX Runtime cannot run the optimized model, nothing written: "
                                      f"{one_line(exc)}") from None
    verdict = Verdict(optimized, "optimized")
    figures = verdict.figures
    if options.verify:
        try:
            checked = verify_against_original(
                source.runnable, original.session, candidate,
                original.feeds, "--inputs" if options.inputs_npz else f"seed {options.seed}", options.seed,
                source.measuring, options.provider, options.threads, users_feeds=bool(options.inputs_npz))
        except EquivalenceError as exc:
            raise EquivalenceError(source.label, f"optimized model is not equivalent, nothing written: {exc.problem}") \
                from None
        except NonFiniteReference as exc:
            say(f"{exc.problem}: the model is {source.kept_as}")
            return Verdict(None, "outputs not finite on any inputs tried")
        for note in checked.notes:
            say(note)
        figures.max_abs_diff, figures.verified = checked.max_abs_diff, True
        figures.verify_reference, figures.verify_inputs = checked.reference, checked.inputs
        figures.verify_scales = checked.scales
        failure = check_other_sizes(source, original.session, candidate, options, figures)
        if failure is not None:
            say(f"{failure}: the original is {source.kept_as}")
            return Verdict(None, "optimized model not equivalent at other sizes")
    if options.measure:
        fresh = fresh_sessions(source, make_candidate, options)
        ab = decide_ab(original.session, candidate, original.feeds, fresh)
        figures.latency_before_ms, figures.latency_after_ms = ab.a_median * 1e3, ab.b_median * 1e3
        figures.speedup, figures.timed_runs = ab.speedup, ab.runs
        figures.session_pairs, figures.faster_pairs, figures.rank_test_p = ab.pairs, ab.b_wins, ab.p_value
        slower_at = time_other_points(source, original.session, candidate, fresh, options, figures) \
            if ab.b_is_faster() else ""
        # "Faster" must be more than one lucky session, which a longer run does not reproduce: decide_ab asks
        # it of pairs of fresh sessions (a signed-rank test over them), and at every profile point.
        if slower_at and not options.keep_if_slower and ab.b_is_faster():
            verdict.graph, verdict.reason = None, "optimized model was not faster at every profile point"
            say(f"the optimized model was not measurably faster at {slower_at}: the original is {source.kept_as} "
                "(use --keep-if-slower to override)")
        elif not (ab.b_is_faster() or options.keep_if_slower):
            verdict.graph, verdict.reason = None, "optimized model was not faster"
            say(f"the optimized model was not measurably faster ({figures.latency_after_ms:.3f} ms vs "
                f"{figures.latency_before_ms:.3f} ms, faster in {ab.b_wins} of {ab.pairs} session pairs, "
                f"signed-rank p = {ab.p_value:.2g}): the original is {source.kept_as} "
                "(use --keep-if-slower to override)")
    return verdict


def _point_feeds(source: Source, session: Any, point: Mapping[str, int], seed: int) -> dict[str, np.ndarray] | None:
    """Random inputs at a point, or None when the original does not run on them (a size the model cannot take)."""
    feeds = random_feeds(session, seed, source.shapes_at(point))
    try:
        session.run(None, dict(feeds))
    except Exception:  # noqa: BLE001 - ORT's own types: the original refuses this size
        return None
    return feeds


def check_other_sizes(source: Source, session: Any, candidate: Any, options: OptimizeOptions,
                      figures: VerifyFigures) -> str | None:
    """Equivalence at the profile's other points and at one off-profile point (every symbol at a size the
    profile does not list, so a rewrite valid only at the measuring sizes cannot pass), against the original
    in float32 with the dtype's tolerance; what failed, in words, or None. Points the original cannot run at
    are skipped (the off-profile one tries another size first)."""
    plan = source.shapes
    if plan is None or not plan.is_dynamic:
        return None
    points = [(p, False) for p in plan.points()[1:]] + [(p, True) for p in plan.off_profile()]
    off_checked = False
    for point, off in points:
        if off and off_checked:
            break
        feeds = _point_feeds(source, session, point, options.seed)
        if feeds is None:
            continue
        label = plan.describe(point)
        try:
            check_equivalence(session, candidate, feeds, label,
                              lambda k, p=point: random_feeds(session, options.seed + k, source.shapes_at(p)))
        except EquivalenceError as exc:
            return f"the optimized model differs from the original at {label} ({exc.problem})"
        except NonFiniteReference:
            continue
        except Exception as exc:  # noqa: BLE001 - ORT refuses the optimized model at this size
            return f"ONNX Runtime cannot run the optimized model at {label} ({one_line(exc)})"
        figures.checked_at.append(label)
        off_checked = off_checked or off
    return None


def time_other_points(source: Source, session: Any, candidate: Any, fresh: Callable[[str], Any],
                      options: OptimizeOptions, figures: VerifyFigures) -> str:
    """The A/B at every profile point after the first, once the first found the optimized model faster
    (recorded in ``figures.profile_points`` with the first); the points where the optimized model was not
    faster, in words ("" when none)."""
    plan = source.shapes
    if plan is None or not plan.is_dynamic:
        return ""
    points = plan.points()
    figures.profile_points = [{"point": points[0], "latency_before_ms": figures.latency_before_ms,
                               "latency_after_ms": figures.latency_after_ms, "faster": True}]
    slower: list[str] = []
    for point in points[1:]:
        feeds = _point_feeds(source, session, point, options.seed)
        if feeds is None:
            continue
        ab = decide_ab(session, candidate, feeds, fresh)
        figures.profile_points.append({"point": point, "latency_before_ms": ab.a_median * 1e3,
                                       "latency_after_ms": ab.b_median * 1e3, "faster": ab.b_is_faster()})
        if not ab.b_is_faster():
            slower.append(plan.describe(point))
    return "; ".join(slower)


def _time_original(original: OriginalRun | OriginalNotRunnable | None, options: OptimizeOptions, source: Source,
                   say: Callable[[str], None]) -> Verdict:
    verdict = Verdict(None, "")
    if isinstance(original, OriginalNotRunnable):
        say(f"{original.problem}: not timed; the model is {source.kept_as}")
    elif original is not None and options.measure:
        figures = verdict.figures
        figures.latency_before_ms = figures.latency_after_ms = median_latency(original.session, original.feeds) * 1e3
        figures.speedup, figures.timed_runs = 1.0, 20
    return verdict


# ---- place -------------------------------------------------------------------------------------------


@dataclass
class PlaceRequest:
    """``--place``: the topology to plan the optimized model on, the placement options, where the plan
    goes, and how to show it (the CLI prints the baselines beside RL)."""

    topology: Any  # xflow.placement.topology.Topology
    options: Any  # xflow.placement.place.PlaceOptions
    plan_path: str
    progress: Callable[[int, float], None] | None = None
    show: Callable[[Any], None] | None = None


def place(graph: Graph, request: PlaceRequest, cost_model: CostModel, name: str) -> Any:
    """The place stage: plan ``graph`` (the one written) on the topology with the run's own cost model
    (same provider and cost cache as the search); a PlacementResult."""
    from xflow.placement.place import place as place_model

    return place_model(graph, cost_model, request.topology, request.options, name, request.progress)


# ---- write -------------------------------------------------------------------------------------------


def write(source: Source, graph: Graph | None, out_path: str, scratch: str) -> tuple[int, bool]:
    """The write stage: ``graph``, or the original when None (a byte-for-byte copy of its file where its
    weights are in it); (ONNX nodes written, whether it is a copy)."""
    if graph is None and source.copyable:
        assert source.path is not None
        copy_atomically(source.path, out_path, scratch)
        return source.onnx_nodes, True
    return save(graph if graph is not None else source.graph, out_path, scratch=scratch), False


# ---- the chain ---------------------------------------------------------------------------------------


def check_output_path(in_path: str, out_path: str) -> None:
    """Refuse IN == OUT and outputs that cannot be written, before any work is done."""
    if os.path.abspath(in_path) == os.path.abspath(out_path) or (
            os.path.exists(out_path) and os.path.exists(in_path) and os.path.samefile(in_path, out_path)):
        raise XflowError(out_path, "output is the input file; choose another output path")
    check_output_file(out_path)
    directory = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(directory):
        raise XflowError(out_path, "output directory does not exist")
    if not os.access(directory, os.W_OK):
        raise XflowError(out_path, "output directory is not writable")


def make_cost_model(options: OptimizeOptions, graph: Graph | None = None) -> CostModel:
    """The cost model the options ask for; opens (or creates) the cost cache for measured costs. With
    ``graph``, a model whose weights fit in the CPU's last-level cache is measured in the cache."""
    if options.cost == "analytic":
        return AnalyticCost()
    if options.cost != "measured":
        raise XflowError(None, f"unknown cost model {options.cost!r}; choose measured or analytic")
    batch_bytes = in_cache_batch_bytes(graph, options.provider) if graph is not None else None
    return MeasuredCost(options.provider, options.threads, CostCache(options.cost_db), batch_bytes=batch_bytes)


def profile_cost(model: CostModel, plan: ShapePlan | None) -> CostModel:
    """The cost model the search uses: ``model`` itself for a static model; for a dynamic one, the mean of
    ``model``'s costs at the shape profile's points (``xflow.search.profile_cost``)."""
    return ProfileCost(model, plan.points()) if plan is not None and plan.is_dynamic else model


def _cost_figures(model: CostModel) -> dict[str, Any]:
    if isinstance(model, ProfileCost):
        model = model.model
    if not isinstance(model, MeasuredCost):
        return {}
    stats = model.stats
    return {"cost_db": str(model.cache.path) if model.cache is not None else None,
            "cost_db_hits": stats.cache_hits, "cost_db_misses": stats.cache_misses,
            "nodes_measured": stats.measured, "measure_sessions": stats.sessions,
            "measure_seconds": stats.seconds, "nodes_not_measurable": stats.fallback + stats.failed,
            "session_scale": [min(stats.session_factors), max(stats.session_factors)] if stats.session_factors
            else []}


def _search_figures(result: SearchReport, rules_file: str, rules: list[Rule], coster: GraphCoster) -> dict[str, Any]:
    return {"rules_file": rules_file, "rules_loaded": len(rules), "cost_model": coster.model.name,
            "cost_before": result.initial_cost, "search_seconds": result.seconds,
            "search_stop": str(result.stop_reason), "graphs_explored": result.explored,
            "graphs_generated": result.generated, "cost_cache_lookups": result.cost_lookups,
            "cost_cache_hits": result.cost_hits}


def _chosen_figures(result: SearchReport, chosen: Finalist | None, rules: list[Rule]) -> dict[str, Any]:
    steps = chosen.steps if chosen is not None else ()
    applied = {s.rule for s in steps}
    figures: dict[str, Any] = {"cost_after": chosen.cost if chosen is not None else result.best_cost,
                               "rules_applied": dict(Counter(s.rule for s in steps)),
                               "rule_names": {r.name: r.readable_name for r in rules if r.name in applied},
                               "steps": [{"rule": s.rule, "nodes": list(s.nodes)} for s in steps]}
    if chosen is not None:
        simplified = chosen.simplified
        figures.update(splits_folded=simplified.nested_splits, elementwise_hoisted=simplified.elementwise_hoisted,
                       channelwise_hoisted=simplified.channelwise_hoisted, splits_regridded=simplified.regridded,
                       weights_permuted=simplified.weights_permuted)
    return figures


def _select_figures(finalists: list[Finalist], picked: Picked | None) -> dict[str, Any]:
    if picked is None:
        return {}
    return {"finalists": [{"estimated_ms": f.cost * 1e3, "rewrites": len(f.steps),
                           "nodes": len(f.simplified.graph.nodes),
                           "measured_ms": (picked.medians[i] * 1e3 if picked.medians[i] is not None else None),
                           "chosen": i == picked.index, "completed": f.completed}
                          for i, f in enumerate(finalists)]}


@dataclass
class _Run:
    """What the chain made before anything is written: the graph to write (None: the original), the
    report (node counts of the written model still to fill) and the placement, if asked for."""

    graph: Graph | None
    report: OptimizeReport
    placement: Any = None


def _chain(source: Source, output_label: str, options: OptimizeOptions, cost_model: CostModel | None,
           say: Callable[[str], None], progress: Callable[[SearchReport], None] | None, scratch: str,
           place_request: PlaceRequest | None) -> _Run:
    """load's result -> search -> finalize -> select -> verify -> place, in memory."""
    graph = source.graph
    rules_file = options.rules_path or str(default_rules_path())
    rules: list[Rule] = list(options.rules) if options.rules is not None else load_rules(options.rules_path)
    refuse_stale_proofs(rules, rules_file)
    coster = GraphCoster(profile_cost(cost_model or make_cost_model(options, graph), source.shapes))
    result = search(graph, rules, coster, options, progress)
    original: OriginalRun | OriginalNotRunnable | None = None
    if options.measure or (result.steps and options.verify):
        try:
            original = run_original(source, options)
        except OriginalNotRunnable as exc:
            original = exc
    feeds = original.feeds if isinstance(original, OriginalRun) else None
    held: set[str] = set()  # what the probe found, for the report

    def probe(g: Graph, names: Sequence[str]) -> frozenset[str] | None:
        found = denormal_values(g, names, feeds or {}, options, scratch)
        held.update(found or ())
        return found
    finalists = finalize(result, options, coster, rules, probe if feeds is not None else None)
    picked = None
    if len(finalists) > 1 and isinstance(original, OriginalRun):
        picked = select_by_latency(finalists, original.feeds, options, scratch)
    chosen = finalists[picked.index if picked is not None else 0] if finalists else None
    if not rules:
        say(f"no rules in {rules_file}: the model is {source.kept_as}")
    elif chosen is None:
        say(f"no rewrite lowers the cost ({len(rules)} rules, {result.explored} graphs explored): "
            f"the model is {source.kept_as}")
    verdict = verify(chosen.simplified.graph if chosen is not None else None, original, options, scratch,
                     source, say, output_label)
    if chosen is None:
        verdict.reason = "no rules" if not rules else "no improving rewrite"
    written = verdict.graph if verdict.graph is not None else graph
    report = OptimizeReport(
        input=source.label, output=output_label, nodes_before=source.onnx_nodes, nodes_after=source.onnx_nodes,
        ops_before=graph.op_counts(), ops_after=written.op_counts(), ir_nodes_before=len(graph.nodes),
        ir_nodes_after=len(written.nodes), nodes_opaque=graph.opaque_count(),
        nodes_opaque_computing=len(graph.opaque_computing()), decision=verdict.reason,
        **_search_figures(result, rules_file, rules, coster), **_chosen_figures(result, chosen, rules),
        **_select_figures(finalists, picked), **asdict(verdict.figures), **_cost_figures(coster.model),
        values_with_denormals=sorted(held))
    placement = None
    if place_request is not None:
        plan = source.shapes
        placed = graph_at(written, plan.points()[0]) if plan is not None and plan.is_dynamic else written
        placement = place(placed, place_request, coster.model, os.path.basename(output_label))
        report.plan_output = place_request.plan_path
        report.placement_chosen, report.placement_seconds = placement.plan.chosen, placement.plan.seconds
    return _Run(verdict.graph, report, placement)


def _finish(report: OptimizeReport, nodes_written: int, copied: bool, started: float) -> OptimizeReport:
    report.copied = copied
    if report.decision != "optimized":
        report.decision = f"{'copied' if copied else 'original re-encoded'} ({report.decision})"
    report.nodes_after = nodes_written
    report.total_seconds = time.perf_counter() - started
    return report


def optimize_file(in_path: str, out_path: str, options: OptimizeOptions, cost_model: CostModel | None = None,
                  say: Callable[[str], None] = print,
                  progress: Callable[[SearchReport], None] | None = None,
                  place_request: PlaceRequest | None = None, report_path: str | None = None) -> OptimizeReport:
    """Optimize ``in_path`` into ``out_path`` (and write the report to ``report_path``, when given); the
    written model is verified equal and never slower (unless ``keep_if_slower``). Raises XflowError for bad
    input; writes nothing on failure: every output, or none."""
    started = time.perf_counter()
    check_output_path(in_path, out_path)
    plan_path = place_request.plan_path if place_request is not None else None
    check_distinct(run_files(in_path, out_path, options, plan_path, report_path))
    if place_request is not None:
        check_output_file(place_request.plan_path, "plan output")
    source = load_source(in_path, options)
    clash = would_overwrite(source.graph, out_path)
    if clash is not None:
        raise XflowError(out_path, f"writing it would replace {clash}, which holds the input's weights; "
                                   "choose another output path")
    check_distinct({**run_files(in_path, out_path, options, plan_path, report_path),
                    **{f"IN.onnx's weights file {os.path.basename(f)}": f for f in weight_files(source.graph)}})
    with run_folder(out_path) as scratch:
        run = _chain(source, out_path, options, cost_model, say, progress, scratch, place_request)
        outputs = [out_path, f"{out_path}.data", *(p for p in (plan_path, report_path) if p)]
        with all_or_none(outputs, scratch):  # a report into a full disk takes the model back out
            nodes_written, copied = write(source, run.graph, out_path, scratch)
            keep_private(in_path, [out_path, f"{out_path}.data"])
            if run.placement is not None and place_request is not None:
                write_json(place_request.plan_path, run.placement.plan.to_json(), scratch)
            report = _finish(run.report, nodes_written, copied, started)
            if report_path:
                write_json(report_path, report.to_json(), scratch if same_folder(report_path, out_path) else None)
        if run.placement is not None and place_request is not None and place_request.show is not None:
            place_request.show(run.placement.plan)
    return report


def run_files(in_path: str, out_path: str, options: OptimizeOptions, plan_path: str | None = None,
              report_path: str | None = None) -> dict[str, str | None]:
    """Every file one optimize run reads or writes, by the role the user gave it (``check_distinct``)."""
    return {"IN.onnx": in_path, "OUT.onnx": out_path, "OUT.onnx's data file": f"{out_path}.data",
            "--rules": options.rules_path, "--inputs": options.inputs_npz, "--cost-db": options.cost_db,
            "the plan file (--place)": plan_path, "--report": report_path}


def optimize_model(model: onnx.ModelProto | bytes | str, options: OptimizeOptions, cost_model: CostModel | None = None
                   ) -> tuple[onnx.ModelProto, OptimizeReport]:
    """Optimize a model in memory (or a file) and return the result with its report: the same checks
    as ``optimize_file`` (verified; the original comes back when the optimized one is not faster).
    Scratch files, needed only for models with external or very large weights, go in a run folder under
    the system's temp directory."""
    started = time.perf_counter()
    path = os.fspath(model) if isinstance(model, str | os.PathLike) else None
    check_distinct({"the model": path, "rules_path": options.rules_path,
                    "inputs_npz": options.inputs_npz, "cost_db": options.cost_db})
    source = load_source(model, options)
    with _api_scratch() as scratch:
        run = _chain(source, "<ModelProto>", options, cost_model, lambda _m: None, None, scratch, None)
    if run.graph is None:  # the original itself (given, or parsed from its file with its weights)
        result = source.proto if source.proto is not None else onnx.load(source.label)
        return result, _finish(run.report, len(result.graph.node), True, started)
    result = to_model_proto(run.graph)
    if not _fits_in_memory(run.graph):  # weights read in from their files: the model stands on its own
        onnx.load_external_data_for_model(result, run.graph.context.base_dir if run.graph.context else "")
    return result, _finish(run.report, len(result.graph.node), False, started)


@contextlib.contextmanager
def _api_scratch() -> Iterator[str]:
    with run_folder(os.path.join(tempfile.gettempdir(), "xflow")) as scratch:
        yield scratch


def optimize(model: onnx.ModelProto | bytes | str, **options: Any) -> onnx.ModelProto:
    """Optimize an ONNX model (a ModelProto or a path) and return the optimized ModelProto.

    Keyword options are the fields of ``OptimizeOptions`` (``rules_path``, ``alpha``, ``budget``,
    ``time_limit``, ``provider``, ``threads``, ``cost``, ``cost_db``, ``input_shapes``, ``shape_profile``
    (``{"batch": (1, 8)}``: sizes of a dynamic dim, see ``xflow.onnx_io.profile``), ``seed``,
    ``keep_if_slower``, ...). Raises XflowError (EquivalenceError on a mismatch) as the CLI would."""
    known = {f.name for f in dataclasses.fields(OptimizeOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return optimize_model(model, OptimizeOptions(**options))[0]

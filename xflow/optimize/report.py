"""The report of one run (``--report``), assembled from the passes' results in one place."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from xflow.cost.base import CostModel
from xflow.cost.measured import MeasuredCost
from xflow.cost.profile_mean import ProfileCost
from xflow.optimize.decision import Decision
from xflow.optimize.finalize import Finalized
from xflow.optimize.load import Source
from xflow.optimize.search import Searched
from xflow.optimize.select import Selected
from xflow.optimize.size import ModelSize, graph_size
from xflow.optimize.subgraphs import step_subgraphs
from xflow.optimize.verify import Verified, VerifyFigures
from xflow.optimize.write import Written
from xflow.search import Step

#: The layout of ``--report``'s JSON. 2: ONNX op types in ``ops_before``/``ops_after`` (the IR's in ``ir_ops_*``),
#: ``bytes_*``, ``rewrites`` by readable name, ``outcome_reason``, ``simpler``/``not_slower_p``, and every time in ms
#: (``cost_before_ms``, ``cost_after_ms``, ``search_ms``, ``total_ms``, ``measure_ms``, ``placement_step_ms``: in
#: seconds before, named without ``_ms``). 1 (unnumbered): the layout before. 3: each of ``steps`` also states
#: the subgraph it matched and the one put in its place (``before``, ``after``, ``aliases``: ``subgraphs.py``), and
#: ``pairs_ms`` the A/B's medians of each session pair.
SCHEMA_VERSION = 3


@dataclass(kw_only=True)
class OptimizeReport(VerifyFigures):
    """Every figure of one run, as written by ``--report`` (``to_json``; its layout is ``SCHEMA_VERSION``). Ops are
    ONNX op types (the IR's own names only in ``ir_ops_*``), every time is in milliseconds (keys ending ``_ms``),
    rules are named by what they do (``rewrites``) with their ids."""

    input: str
    output: str
    rules_file: str
    rules_loaded: int
    nodes_before: int  # ONNX nodes of the input model
    nodes_after: int  # ONNX nodes of the model written (returned)
    ops_before: dict[str, int]  # ONNX nodes of the input model by op type (domain::type outside the default domain)
    ops_after: dict[str, int]  # the same of the model written
    cost_model: str
    cost_before_ms: float  # the search's estimate of the input graph (a sum over its nodes), ms
    cost_after_ms: float  # the same of the graph chosen
    search_ms: float
    search_stop: str
    graphs_explored: int
    graphs_generated: int
    cost_cache_lookups: int  # node costs asked for during the search (in-memory memo)
    cost_cache_hits: int
    rules_applied: dict[str, int]  # by rule id
    # each rewrite in order: its rule's id and readable name, the nodes it replaced, and the subgraphs it matched
    # and made (``subgraphs.step_subgraphs``: ONNX ops, value names)
    steps: list[dict[str, Any]]
    rule_names: dict[str, str] = field(default_factory=dict)  # readable name of each applied rule, by id
    # the rules applied by readable name: how often, and the ids of the rules of that name
    rewrites: dict[str, dict[str, Any]] = field(default_factory=dict)
    schema_version: int = 0  # ``SCHEMA_VERSION`` (set by ``assemble``)
    decision: str = ""  # ``Decision.describe``: "optimized", "simpler, not slower", or how the original was written
    outcome: str = ""  # the ``Decision``'s value ("optimized", "simpler-not-slower", "kept-original-not-faster", ...)
    outcome_reason: str = ""  # the ``Decision``'s reason, in words
    total_ms: float = 0.0
    cost_db: str | None = None  # the SQLite cost cache used (measured costs only)
    cost_db_hits: int = 0  # node configurations found in it
    cost_db_misses: int = 0
    nodes_measured: int = 0  # node configurations measured in this run
    measure_sessions: int = 0  # ORT sessions built to measure them
    measure_ms: float = 0.0
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
    # then the shape arithmetic over symbolic dims (``xflow.rewrite.shapes``): values folded into initializers,
    # values read through an equal earlier one, nodes deleted
    shapes_folded: int = 0
    shapes_shared: int = 0
    shapes_deleted: int = 0
    # then the constant subgraphs left (``xflow.rewrite.evaluate``): values made initializers, nodes deleted
    constants_evaluated: int = 0
    constant_nodes_deleted: int = 0
    # then equal constants and repeated nodes (``xflow.rewrite.share``): values read through an equal one, nodes
    # deleted
    values_shared: int = 0
    shared_nodes_deleted: int = 0
    bytes_before: int = 0  # the input model's size: its proto and the external data it points at (weights included)
    bytes_after: int = 0  # the same of the model written
    # nodes of the IR before and after (a Gemm is a matmul and an add there, a fused Conv+Relu two nodes), and
    # by the algebra's op names (opaque nodes by their ONNX type)
    ir_nodes_before: int = 0
    ir_nodes_after: int = 0
    ir_ops_before: dict[str, int] = field(default_factory=dict)
    ir_ops_after: dict[str, int] = field(default_factory=dict)
    nodes_opaque: int = 0  # nodes of the loaded model outside the algebra (opaque: carried, never rewritten)
    nodes_opaque_computing: int = 0  # of those, the ones computing at run time (no Constant, no folded shape node)
    copied: bool = False  # the model written is a byte-for-byte copy of the input
    # values a rule whose gain is in the values bound that held float32/64 denormals on the check inputs
    values_with_denormals: list[str] = field(default_factory=list)
    # the measured decisions ("select": the finalists' timing, "ab": an A/B) read from the cost cache, as an earlier
    # run with the same cache measured them (``xflow.optimize.remembered``), and those timed in this run
    decisions_from_cache: list[str] = field(default_factory=list)
    decisions_timed: list[str] = field(default_factory=list)
    plan_output: str | None = None  # --place: the plan written, the placement chosen and its step time
    placement_chosen: str | None = None
    placement_step_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class Passes:
    """The results of the passes before write, in the order they ran."""

    source: Source
    searched: Searched
    finalized: Finalized
    selected: Selected
    verified: Verified
    denormals: frozenset[str] = frozenset()


def assemble(passes: Passes, output_label: str) -> OptimizeReport:
    """The report from the passes' results (the write pass's figures and the placement still to fill)."""
    source, search, verified = passes.source, passes.searched.report, passes.verified
    graph = source.graph
    written = verified.graph if verified.graph is not None else graph
    chosen = passes.selected.chosen
    steps = chosen.steps if chosen is not None else ()
    applied = {s.rule for s in steps}
    names = {r.name: r.readable_name for r in passes.searched.rules if r.name in applied}
    simplified = chosen.simplified if chosen is not None else None
    shaped = chosen.shaped if chosen is not None else None
    evaluated = chosen.evaluated if chosen is not None else None
    shared = chosen.shared if chosen is not None else None
    measured = _measured(passes.searched.coster.model)
    stats = measured.stats if measured is not None else None
    before = source.size if source.size is not None else _unknown_size(source)
    after = graph_size(chosen.graph) if chosen is not None and verified.decision.writes_optimized else before
    return OptimizeReport(
        # the verify pass's figures as they are (the report extends VerifyFigures)
        **vars(verified.figures),
        input=source.label, output=output_label, nodes_before=source.onnx_nodes, nodes_after=source.onnx_nodes,
        ops_before=before.ops, ops_after=after.ops, bytes_before=before.bytes, bytes_after=after.bytes,
        ir_ops_before=graph.op_counts(), ir_ops_after=written.op_counts(), ir_nodes_before=len(graph.nodes),
        ir_nodes_after=len(written.nodes), nodes_opaque=graph.opaque_count(),
        nodes_opaque_computing=len(graph.opaque_computing()), outcome=verified.decision.value,
        rules_file=passes.searched.rules_file, rules_loaded=len(passes.searched.rules),
        cost_model=passes.searched.coster.model.name, cost_before_ms=search.initial_cost * 1e3,
        search_ms=search.seconds * 1e3, search_stop=str(search.stop_reason), graphs_explored=search.explored,
        graphs_generated=search.generated, cost_cache_lookups=search.cost_lookups, cost_cache_hits=search.cost_hits,
        cost_after_ms=(chosen.cost if chosen is not None else search.best_cost) * 1e3,
        rules_applied=dict(Counter(s.rule for s in steps)), rule_names=names, rewrites=_rewrites(steps, names),
        steps=[{"rule": s.rule, "name": names.get(s.rule, s.rule), "nodes": list(s.nodes), **step_subgraphs(s)}
               for s in steps],
        schema_version=SCHEMA_VERSION, outcome_reason=verified.decision.reason,
        splits_folded=simplified.nested_splits if simplified else 0,
        elementwise_hoisted=simplified.elementwise_hoisted if simplified else 0,
        channelwise_hoisted=simplified.channelwise_hoisted if simplified else 0,
        splits_regridded=simplified.regridded if simplified else 0,
        weights_permuted=simplified.weights_permuted if simplified else 0,
        shapes_folded=len(shaped.constants) if shaped else 0, shapes_shared=len(shaped.shared) if shaped else 0,
        shapes_deleted=len(shaped.removed) if shaped else 0,
        constants_evaluated=len(evaluated.values) if evaluated else 0,
        constant_nodes_deleted=len(evaluated.removed) if evaluated else 0,
        values_shared=len(shared.shared) if shared else 0, shared_nodes_deleted=len(shared.removed) if shared else 0,
        finalists=_finalists(passes.finalized, passes.selected),
        cost_db=str(measured.cache.path) if measured is not None and measured.cache is not None else None,
        cost_db_hits=stats.cache_hits if stats else 0, cost_db_misses=stats.cache_misses if stats else 0,
        nodes_measured=stats.measured if stats else 0, measure_sessions=stats.sessions if stats else 0,
        measure_ms=stats.seconds * 1e3 if stats else 0.0,
        nodes_not_measurable=stats.fallback + stats.failed if stats else 0,
        session_scale=[min(stats.session_factors), max(stats.session_factors)]
        if stats and stats.session_factors else [],
        values_with_denormals=sorted(passes.denormals))


def finish(report: OptimizeReport, written: Written, started: float) -> OptimizeReport:
    """The report with the write pass's figures, the decision in words and the run's seconds."""
    report.copied = written.copied
    report.decision = Decision(report.outcome).describe(written.copied)
    report.nodes_after = written.nodes
    report.total_ms = (time.perf_counter() - started) * 1e3
    return report


def _rewrites(steps: tuple[Step, ...] | list[Step], names: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The rules applied by readable name (an id without one stands for itself): count and ids."""
    rewrites: dict[str, dict[str, Any]] = {}
    for step in steps:
        entry = rewrites.setdefault(names.get(step.rule, step.rule), {"count": 0, "ids": []})
        entry["count"] += 1
        if step.rule not in entry["ids"]:
            entry["ids"].append(step.rule)
    return dict(sorted(rewrites.items()))


def _unknown_size(source: Source) -> ModelSize:
    """A source made without its size (not by ``load_source``): its nodes, no op types or bytes."""
    return ModelSize(source.onnx_nodes, {}, 0, 0)


def _measured(model: CostModel) -> MeasuredCost | None:
    if isinstance(model, ProfileCost):
        model = model.model
    return model if isinstance(model, MeasuredCost) else None


def _finalists(finalized: Finalized, selected: Selected) -> list[dict[str, Any]]:
    picked = selected.picked
    if picked is None:
        return []
    return [{"estimated_ms": f.cost * 1e3, "rewrites": len(f.steps), "nodes": len(f.graph.nodes),
             "measured_ms": (picked.medians[i] * 1e3 if picked.medians[i] is not None else None),
             "chosen": f is selected.chosen, "completed": f.completed}  # a runner-up, where it was written
            for i, f in enumerate(finalized.finalists)]

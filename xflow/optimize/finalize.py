"""The finalize pass: the graphs worth timing end to end (the search's best, its branches', the first sweeps
and their completions, the denormal lift), each folded and simplified."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import onnx

from xflow.cost import GraphCoster
from xflow.ir import Graph
from xflow.onnx_io import to_model_proto
from xflow.onnx_io.save import encode_nodes
from xflow.optimize.denormal_probe import DenormalProbe
from xflow.optimize.load import OriginalNotRunnable, OriginalRun
from xflow.optimize.passes import PassResult
from xflow.optimize.search import Searched
from xflow.ort import Sessions
from xflow.rewrite import Match, find_matches, fold_constants
from xflow.rewrite.evaluate import EvaluatedStep, evaluate_constants
from xflow.rewrite.fold import FoldMemo
from xflow.rewrite.shapes import ShapeStep, share_shapes
from xflow.rewrite.share import SharedStep, share_values
from xflow.rewrite.simplify import Simplified, simplify_splits
from xflow.rules import Rule
from xflow.search import Branch, SearchReport, Step, complete_sweeps

_log = logging.getLogger(__name__)

#: Which of the named values of a graph hold denormals when it runs on the original's inputs (None: not known).
Probe = Callable[[Graph, Sequence[str]], "frozenset[str] | None"]

T = TypeVar("T", EvaluatedStep, SharedStep)

#: Branches estimated dearer than this times the best graph are not timed.
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
    # the graph the steps made and that graph folded (None: not known): what its certificate states
    unfolded: Graph | None = None
    folded: Graph | None = None
    # the shape arithmetic of the simplified graph folded, shared and deleted (None: nothing to do)
    shaped: ShapeStep | None = None
    # then the constant subgraphs left evaluated (None: none)
    evaluated: EvaluatedStep | None = None
    # then equal constants and repeated nodes shared (None: none)
    shared: SharedStep | None = None

    @property
    def graph(self) -> Graph:
        """The finalist's graph, folded and simplified, its shape arithmetic folded, shared and deleted, its
        constant subgraphs evaluated, its repeated values shared."""
        if self.shared is not None:
            return self.shared.graph
        if self.evaluated is not None:
            return self.evaluated.graph
        return self.shaped.graph if self.shaped is not None else self.simplified.graph

    @functools.cached_property
    def proto(self) -> onnx.ModelProto:
        """Its ONNX model, made once however many passes need it."""
        return to_model_proto(self.graph)

    @functools.cached_property
    def serialized(self) -> bytes:
        """Its ONNX model's bytes, serialized once for every session made of it."""
        return self.proto.SerializeToString()


@dataclass(kw_only=True)
class Finalized(PassResult):
    """The finalize pass's result: the finalists, the search's best first (``graph``: its graph, None when there
    is none)."""

    finalists: list[Finalist] = field(default_factory=list)


def denormal_probe(ran: OriginalRun | OriginalNotRunnable | None, sessions: Sessions) -> DenormalProbe | None:
    """The denormal probe on the original's inputs (None when the original did not run)."""
    return DenormalProbe(ran.feeds, sessions) if isinstance(ran, OriginalRun) else None


def finalize(searched: Searched, measure: bool, probe: Probe | None = None) -> Finalized:
    """The finalize pass (``finalists`` of the search's result; only the best graph where nothing will ``measure``
    the others), its graph the first finalist's."""
    found = finalists(searched.report, measure, searched.coster, searched.rules, probe)
    return Finalized(graph=found[0].graph if found else None, modified=bool(found), finalists=found)


def finalists(result: SearchReport, measure: bool, coster: GraphCoster, rules: list[Rule],
              probe: Probe | None = None) -> list[Finalist]:
    """The graphs to time end to end: the best graph, then the other branches' best graphs within ``FINALIST_SPREAD``
    of its cost (different graphs only), the cheapest first sweeps from the input alone and applied to the
    best graph (``ROOT_SWEEP_FINALISTS``), then each branch's graph
    with the rules of its path applied at every match left (``complete_sweeps``), where that makes another
    graph; and the best graph (the input, where the search found no rewrite) with each rule whose saving is in the
    values applied at every match whose values ``probe`` finds denormal (every match without a probe;
    ``_value_sweep``); each folded and simplified. None when nothing is left."""
    lifting = [rule for rule in rules if rule.gain_in_values] if measure else []
    memo = FoldMemo()  # the finalists share the model's constants: a fold they share is made and held once
    deleting = [rule for rule in rules if not rule.dst]  # a node that computes its input: Identity, ...

    def finalist(source: Branch, completed: bool = False) -> Finalist:
        return _finalist(_applied_everywhere(source, deleting, coster) or source, completed, memo)
    reducing = [rule for rule in rules if rule.dst and len(rule.dst) < len(rule.src)] if measure else []
    if not result.steps:
        lifted = _value_sweep(Branch(result.graph, result.best_cost, ()), lifting, coster, probe)
        if lifted is not None:
            return [finalist(lifted, True)]
        # no rule lowers the estimate: the input without its copies and with its shape arithmetic folded, shared and
        # deleted, where it has any, and the input with every rule that removes nodes applied
        plain = finalist(Branch(result.graph, result.best_cost, ()))
        found = [plain] if plain.steps or any(s is not None for s in (plain.shaped, plain.evaluated, plain.shared)) \
            else []
        fewer = _applied_everywhere(Branch(result.graph, result.best_cost, ()), reducing, coster)
        return _distinct(found + [finalist(fewer, True)]) if fewer is not None else found
    best = Branch(result.graph, result.best_cost, result.steps)
    if not measure:
        return [finalist(best)]  # nothing will time the others
    sources = [best]
    seen = {result.graph.hash_sum}
    for alt in result.branches:
        if not alt.steps or alt.graph.hash_sum in seen or alt.cost > FINALIST_SPREAD * result.best_cost:
            continue
        seen.add(alt.graph.hash_sum)
        sources.append(alt)
    found = [finalist(source) for source in sources]
    # each first sweep from the input alone (one rule at every match): a rule whose measured gain is real
    # end to end stays separable from one whose estimated gain is not, when the search's best graph mixes
    # the two (an Add -> Sum that escapes a slow ORT fusion beside matmul merges the estimate flatters)
    by_name = {rule.name: rule for rule in rules}
    taken = [sweep for sweep in sorted(result.root_sweeps, key=lambda alt: alt.cost)
             if sweep.graph.hash_sum not in seen and sweep.cost < result.initial_cost
             and sweep.cost <= FINALIST_SPREAD * result.best_cost][:ROOT_SWEEP_FINALISTS]
    for sweep in taken:
        seen.add(sweep.graph.hash_sum)
        found.append(finalist(sweep))
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
        found.append(finalist(Branch(combined.graph, combined.cost, best.steps + combined.steps), True))
    for source in sources:
        path_rules = [by_name[name] for name in dict.fromkeys(s.rule for s in source.steps) if name in by_name]
        completed = complete_sweeps(source.graph, source.cost, path_rules, coster)
        if completed is None or completed.graph.hash_sum in seen or completed.cost > FINALIST_SPREAD * result.best_cost:
            continue
        seen.add(completed.graph.hash_sum)
        found.append(finalist(Branch(completed.graph, completed.cost, source.steps + completed.steps), True))
    lifted = _value_sweep(best, lifting, coster, probe)
    if lifted is not None and lifted.graph.hash_sum not in seen:
        seen.add(lifted.graph.hash_sum)
        found.append(finalist(lifted, True))
    fewer = _applied_everywhere(best, reducing, coster)
    if fewer is not None and fewer.graph.hash_sum not in seen:
        found.append(finalist(fewer, True))
    return _distinct(found)


def _applied_everywhere(source: Branch, rules: list[Rule], coster: GraphCoster) -> Branch | None:
    """``source`` with each of ``rules`` applied at every match, whatever the estimates (None: no match). Two kinds
    go so: rules that delete a node computing its own input (no right-hand side: an Identity, a Cast to its input's
    type, a one-input Concat), in every finalist, and rules that remove nodes (fewer on the right: a Pad into the
    Conv after it, a Transpose pair cancelled), in one more finalist made from the best graph. ONNX Runtime deletes
    or fuses such nodes when it loads a model, so no measured cost falls when one goes and the search keeps them,
    but a model that keeps them is not the simpler one (ALBERT's shared layers read each weight through an Identity:
    66; MobileNet-v2's depthwise Convs read 13 Pads); select prefers the simpler of finalists that time alike
    (``select.SELECT_TIE``)."""
    swept = complete_sweeps(source.graph, source.cost, rules, coster, min_matches=1) if rules else None
    return Branch(swept.graph, swept.cost, source.steps + swept.steps) if swept is not None else None


def _distinct(found: list[Finalist]) -> list[Finalist]:
    """The finalists whose folded and simplified graphs differ (the first of each kept): graphs that differ before
    folding may fold to one, and timing a graph against itself only costs time."""
    kept: dict[int, Finalist] = {}
    for finalist in found:
        kept.setdefault(finalist.graph.hash_sum, finalist)
    return list(kept.values())


def _value_sweep(source: Branch, rules: list[Rule], coster: GraphCoster,
                 probe: Probe | None = None) -> Branch | None:
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
    return Branch(swept.graph, swept.cost, source.steps + swept.steps) if swept is not None else None


def _finalist(source: Branch, completed: bool = False, memo: FoldMemo | None = None) -> Finalist:
    folded = fold_constants(source.graph, memo=memo)
    simplified = simplify_splits(folded)
    shaped = _shaped(simplified.graph)
    evaluated = _written(evaluate_constants(shaped.graph if shaped is not None else simplified.graph))
    shared = _written(share_values(evaluated.graph if evaluated is not None else
                                   shaped.graph if shaped is not None else simplified.graph))
    return Finalist(simplified, source.cost, source.steps, completed, source.graph, folded, shaped, evaluated,
                    shared)


def _shaped(graph: Graph) -> ShapeStep | None:
    """``graph``'s shape arithmetic folded, shared and deleted (``share_shapes``), where the op-table nodes whose
    original ONNX node read a value it deletes can be written anew (None: nothing changes, or one cannot)."""
    step = share_shapes(graph)
    if step is None:
        return None
    try:
        encode_nodes(step.graph)
    except ValueError as exc:  # an encoder cannot write a node without its original's computed input
        _log.info("shape arithmetic left as it is: %s", exc)
        return None
    return step



def _written(step: T | None) -> T | None:
    """``step`` where the graph it makes can be written (None: there is no step, or an encoder cannot write a node
    of its graph without its original's computed input)."""
    if step is None:
        return None
    try:
        encode_nodes(step.graph)
    except ValueError as exc:
        _log.info("%s left out: %s", type(step).__name__, exc)
        return None
    return step

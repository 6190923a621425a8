"""TASO's cost-based backtracking search over rule applications.

A priority queue of graphs ordered by cost; pop the cheapest, apply every rule at every match,
keep new graphs whose cost is below alpha x best, skip graphs seen before (structural hash), reject
cycles and graphs grown past a cap; stop at the budget (graphs popped) or the time limit.
Matching is incremental: a derived graph keeps its parent's matches that do not touch the changed
region and searches anew only from the nodes around it.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from xflow.cost.base import GraphCoster
from xflow.ir import Graph, Node, NodeChange, PendingGraph
from xflow.rewrite import Match, RuleIndex
from xflow.rewrite.apply import MatchTargets, apply_match, plan_match
from xflow.rules import Rule

#: A graph is a new best only when cheaper by more than float rounding: the same graph reached along
#: another path sums its node costs in another order.
BETTER = 1 - 1e-9

#: Rounds of one rule a sweep applies at most (see ``_sweep``): 8 merges 2**8 copies pairwise.
SWEEP_ROUNDS = 8
#: Rules swept per expansion: those of its cheapest single children.
SWEEP_RULES = 3
#: A branch (see ``backtracking_search``) is searched only if its first sweep saves this share of the cost.
BRANCH_MIN_GAIN = 0.01


@dataclass(frozen=True)
class Step:
    """One rule application on the path from the input graph to a result."""

    rule: str
    nodes: tuple[str, ...]  # names (or first outputs) of the matched nodes
    # the match applied (its bindings are what a certificate states); not part of the step's identity
    match: Match | None = field(default=None, compare=False, repr=False)


class StopReason(StrEnum):
    """Why a search stopped (the value is what reports print)."""

    EXHAUSTED = "exhausted"  # no graph left to expand within alpha
    BUDGET = "budget"  # ``SearchLimits.budget`` expansions done
    PATIENCE = "patience"  # ``SearchLimits.patience`` expansions in a row found no cheaper graph
    TIME = "time"  # ``SearchLimits.time_limit`` reached
    MEMORY = "memory"  # the process's RSS passed ``SearchLimits.memory_limit_mb``
    NO_RULES = "no-rules"  # nothing to apply
    CONVERGED = "converged"  # a branch reached the main search's best graph


@dataclass(frozen=True)
class SearchLimits:
    """How far a search may go and how it explores: TASO's relaxation, its budgets, and the sweeps. Its
    defaults are ``xflow optimize``'s (``xflow.optimize.options.DEFAULTS.search``): the one place they are written."""

    alpha: float = 1.05  # keep graphs whose cost is below alpha x the best cost
    budget: int = 300  # graphs expanded (popped) at most
    time_limit: float = 60.0  # seconds, the branches' searches included
    max_growth: float = 2.0  # a graph may grow to this many times the input's nodes (+4)
    memory_limit_mb: float | None = None  # stop expanding once the process's RSS passes this
    patience: int | None = 10  # once a cheaper graph is found, stop after this many expansions without one (None: no)
    sweep: bool = True  # also apply a rule at all of its improving matches at once (see ``_sweep``)
    sweep_rounds: int = SWEEP_ROUNDS
    sweep_rules: int = SWEEP_RULES
    branches: int = 2  # other first sweeps searched on as roots of their own (see ``backtracking_search``)


@dataclass
class SearchReport:
    """The best graph found and how the search went."""

    graph: Graph
    initial_cost: float
    best_cost: float
    steps: tuple[Step, ...]
    stop_reason: StopReason
    explored: int
    generated: int
    seconds: float
    cost_lookups: int = 0
    cost_hits: int = 0
    trace: list[tuple[float, float]] = field(default_factory=list)  # (elapsed s, best cost)
    # the best graph of each other branch (see ``backtracking_search``'s ``branches``), cheapest first
    branches: list[Branch] = field(default_factory=list)
    root_sweeps: list[Branch] = field(default_factory=list)  # the sweeps made from the input graph


@dataclass(frozen=True)
class Branch:
    """A graph the search reached along another branch, with its estimated cost and its path."""

    graph: Graph
    cost: float
    steps: tuple[Step, ...]


@dataclass
class _Entry:
    graph: Graph | PendingGraph
    parent_steps: tuple[Step, ...]  # the path to the parent (this entry's own step is ``applied``)
    parent: _Entry | None = None
    applied: Match | None = None
    matches: list[Match] | None = None
    change: NodeChange | None = None  # from the parent's graph, where it is not ``graph.change`` (a sweep's)

    @property
    def steps(self) -> tuple[Step, ...]:
        """The path from the input graph (built on demand: most entries are never popped)."""
        return self.parent_steps if self.applied is None else self.parent_steps + (_step(self.applied),)


def _step(match: Match) -> Step:
    return Step(match.rule.name, tuple(n.name or n.outputs[0] for n in match.nodes), match)


def initial_matches(graph: Graph, rules: Sequence[Rule] | RuleIndex) -> list[Match]:
    """All matches of all rules (rules whose ops are absent from the graph are skipped)."""
    index = rules if isinstance(rules, RuleIndex) else RuleIndex(rules)
    return index.all_matches(graph)


def derived_matches(parent: Graph, parent_matches: list[Match], applied: Match, child: Graph,
                    rules: Sequence[Rule] | RuleIndex, change: NodeChange | None = None) -> list[Match]:
    """Matches of ``child`` = parent matches away from the change + matches through changed nodes.
    ``change`` is what made ``child`` from ``parent`` (default: ``child.change``, else found by comparing)."""
    index = rules if isinstance(rules, RuleIndex) else RuleIndex(rules)
    # A match of the child that is not a match of the parent uses a new node, or has as an internal
    # value (no readers outside the match) one whose readers changed; all else a match depends on (ops,
    # attributes, edges, names, types, constness) is unchanged. A value read by as many nodes as a
    # source pattern has, before and after, is internal in no match of either graph.
    removed, added = change or child.change or _change(parent, child)
    anchor = _anchors(parent, child, removed, added, index.widest)
    gone = {id(n) for n in removed}
    kept = [m for m in parent_matches if all(id(n) not in gone and id(n) not in anchor for n in m.nodes)]
    kept.extend(index.anchored_matches(child, anchor.values()))
    return kept


def _anchors(parent: Graph, child: Graph, removed: tuple[Node, ...], added: tuple[Node, ...],
             widest: int) -> dict[int, Node]:
    """The child's nodes a match must go through to be new: the added nodes and the producers of values
    the change gave or took readers from (when they have fewer readers than ``widest``)."""
    anchor: dict[int, Node] = {id(n): n for n in added}
    for n in (*removed, *added):
        for name in (*n.inputs, *n.implicit):
            producer = child.producers.get(name) if name else None
            if producer is not None and id(producer) not in anchor and (
                    _readers(child, name) < widest or _readers(parent, name) < widest):
                anchor[id(producer)] = producer
    return anchor


def _build(child: PendingGraph, match: Match, targets: MatchTargets) -> Graph:
    """The Graph a kept child stands for, made by ``apply_match`` on its parent (the same change, so
    the same graph; the child was checked for cycles when it was kept)."""
    graph = apply_match(child.parent, match, targets)
    assert graph is not None
    return graph


def _readers(graph: Graph, value: str) -> int:
    """How many nodes read ``value`` (outputs count as a reader outside any match)."""
    return len({id(u) for u, _ in graph.users.get(value, ())}) + (value in graph.output_set)


def _change(parent: Graph, child: Graph) -> NodeChange:
    """(removed, added) between two graphs, for a child not made by ``Graph.derive`` from ``parent``."""
    parent_ids, child_ids = {id(n) for n in parent.nodes}, {id(n) for n in child.nodes}
    return NodeChange(tuple(n for n in parent.nodes if id(n) not in child_ids),
                      tuple(n for n in child.nodes if id(n) not in parent_ids))


class _NodesOf:
    """Some nodes of a graph, seen as a graph of their own by ``GraphCoster.cost``."""

    def __init__(self, graph: Graph | PendingGraph, nodes: tuple[Node, ...]) -> None:
        self.graph, self.nodes = graph, nodes

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") or name == "graph":
            raise AttributeError(name)
        return getattr(self.graph, name)


def _derived_cost(coster: GraphCoster, change_costs: dict[NodeChange, tuple[float, float]],
                  parent: Graph, parent_cost: float, child: PendingGraph) -> float:
    """``coster.derived_cost(parent, parent_cost, child)``, the same float, with the sums of the removed
    and the added nodes' costs kept per change: a match kept from graph to graph mostly makes the
    same change (the same Node objects, so the same costs) in each. With fusion a change's cost also
    depends on the groups around it, which differ from graph to graph: no memo then."""
    if coster.fusion:
        return coster.derived_cost(parent, parent_cost, child)  # type: ignore[arg-type]
    change = child.change
    sums = change_costs.get(change)
    if sums is None:
        removed, added = change
        sums = change_costs[change] = (coster.cost(_NodesOf(parent, removed)),  # type: ignore[arg-type]
                                       coster.cost(_NodesOf(child, added)))  # type: ignore[arg-type]
    return parent_cost - sums[0] + sums[1]


@dataclass
class _Swept:
    """A graph made by applying several matches of one rule in turn, with its cost and the change from
    the graph the sweep started from (its matches derive from that graph's)."""

    graph: Graph
    cost: float
    applied: tuple[Match, ...]
    change: NodeChange


def _sweep(parent: Graph, parent_cost: float, wanted: list[Match], index: RuleIndex, coster: GraphCoster,
           cap: int, deadline: float = float("inf"), rounds: int = 1, limit: float = 1.0,
           targets: MatchTargets | None = None, min_applied: int = 2) -> _Swept | None:
    """Apply the matches of ``wanted`` (one rule's improving matches on ``parent``) in turn, each one
    whose nodes no earlier rewrite touched (so it is still a match, as ``derived_matches`` keeps it);
    None when fewer than ``min_applied`` (two: one is a child of its own) apply. Repeated structure (BERT's
    layers, an RNN's steps, Inception's blocks) then takes one step of the search instead of one per copy; the
    single-match children stay, so the search can still take any one of them alone.

    With ``rounds`` > 1 the same rule is applied again, up to that many rounds in all, at the matches
    the previous round created that lower the cost: a pairwise rule (merge two matmuls sharing an
    input, batch two sharing a weight) then merges all eight of NasRNN's gates, or batches all its
    steps, in one search step instead of a chain of seven that the search's patience cuts short.

    With ``limit`` > 1 (``wanted`` then holds the rule's matches within that factor of the parent's cost,
    and later rounds take such matches too), the sweep crosses a plateau: the first merge of NasRNN's h
    MatMuls costs more than it saves (it splits each gate's add from its matmul), the next ones save. The
    caller keeps such a sweep only when it ends cheaper than the parent."""
    graph, cost = parent, parent_cost
    applied: list[Match] = []
    single: RuleIndex | None = None
    round_graph = parent
    for round_no in range(rounds):
        if round_no:
            if time.perf_counter() > deadline:
                break
            single = single or RuleIndex([wanted[0].rule])
            wanted = _improving(round_graph, graph, cost, single, coster, cap, limit, targets)
            if not wanted:
                break
        round_graph = graph
        touched: set[int] = set()
        applied_before = len(applied)
        for match in wanted:
            if any(id(n) in touched for n in match.nodes):
                continue
            change = plan_match(graph, match, targets)
            if len(graph.nodes) - len(change.removed) + len(change.added) > cap:
                continue
            if graph.creates_cycle(change.removed, change.added):
                continue
            child = graph.derive(change.removed, change.added, change.types)
            cost = coster.derived_cost(graph, cost, child)
            touched.update(id(n) for n in change.removed)
            touched.update(_anchors(graph, child, change.removed, change.added, index.widest))
            graph = child
            applied.append(match)
        if len(applied) == applied_before:
            break
    if len(applied) < min_applied:
        return None
    return _Swept(graph, cost, tuple(applied), _change(parent, graph))


def _improving(before: Graph, graph: Graph, cost: float, single: RuleIndex, coster: GraphCoster,
               cap: int, limit: float = 1.0, targets: MatchTargets | None = None) -> list[Match]:
    """The matches of ``single``'s rule that the change from ``before`` to ``graph`` created (through
    its new nodes) and that make ``graph`` cheaper (below ``limit`` times its cost), cheapest first."""
    removed, added = _change(before, graph)
    anchor = _anchors(before, graph, removed, added, single.widest)
    candidates = [(match, child) for match in single.anchored_matches(graph, anchor.values())
                  if (child := _pending_child(graph, match, cap, targets=targets)) is not None]
    coster.prefetch([(child, child.change.added) for _, child in candidates])
    costed = [(coster.derived_cost(graph, cost, child), match)  # type: ignore[arg-type]
              for match, child in candidates]
    return _in_sweep_order(graph, [(m, c) for c, m in costed if c < limit * cost])


def _pending_child(graph: Graph, match: Match, cap: int, seen: set[int] | frozenset[int] = frozenset(),
                   targets: MatchTargets | None = None) -> PendingGraph | None:
    """The child applying ``match`` makes, unbuilt; None when it would grow past ``cap`` nodes, is in
    ``seen`` (by structural hash) or would contain a cycle."""
    change = plan_match(graph, match, targets)
    removed, added = change.removed, change.added
    if len(graph.nodes) - len(removed) + len(added) > cap:  # plan_match removes each node once
        return None
    digest = graph.derived_hash(removed, added)
    if digest in seen or graph.creates_cycle(removed, added):
        return None
    return graph.pending(removed, added, change.types, digest)


def _in_sweep_order(graph: Graph, improving: list[tuple[Match, float]]) -> list[Match]:
    """Cheapest first; among equally cheap matches, the one whose nodes come first in the graph. Copies
    of one structure (NasRNN's x and h halves of a gate merge) are then paired alike in every copy, so
    the pieces of their splits line up and ``simplify_splits`` can add them before splitting."""
    position = graph.position
    return [m for m, _ in sorted(improving, key=lambda mc: (mc[1], [position[n] for n in mc[0].nodes]))]



def complete_sweeps(graph: Graph, cost: float, rules: Sequence[Rule], coster: GraphCoster,
                    max_growth: float = 2.0, rounds: int = 2 * SWEEP_ROUNDS,
                    time_limit: float = 10.0, min_matches: int = 2,
                    keep: Callable[[Match], bool] | None = None) -> Branch | None:
    """Apply each of ``rules`` in turn at every match it has in ``graph``, in rounds as a sweep does
    (copies of a structure paired alike, matches the last round created taken next), whatever the
    estimated costs say; None when no rule applies at ``min_matches`` places (a search result's rules already
    took a lone match) or more; with ``keep``, only the matches it keeps count. The steps are this completion's
    alone.

    A search result's rules stop where single-kernel costs stop falling: NasRNN's last merge of two
    [512,2048] h matmuls into one [512,4096] measures dearer than the pair it replaces, yet the
    completed graph lets ``simplify_splits`` add each step's x and h projections once before one split,
    and runs as fast as the hand-written batched form. ``xflow optimize`` times such a completion end to
    end against the search's own graphs and keeps it only if it runs faster."""
    deadline = time.perf_counter() + time_limit
    cap = max(int(len(graph.nodes) * max_growth), len(graph.nodes) + 4)
    targets = MatchTargets()
    steps: list[Step] = []
    for rule in rules:
        if time.perf_counter() > deadline:
            break
        index = RuleIndex([rule])
        matches = [m for m in index.all_matches(graph) if keep is None or keep(m)]
        if len(matches) < min_matches:
            continue
        swept = _sweep(graph, cost, _in_sweep_order(graph, [(m, 0.0) for m in matches]), index, coster, cap,
                       deadline, rounds, limit=float("inf"), targets=targets, min_applied=min_matches)
        if swept is not None:
            graph, cost = swept.graph, swept.cost
            steps.extend(_step(m) for m in swept.applied)
    return Branch(graph, cost, tuple(steps)) if steps else None


def rss_mb() -> float:
    """This process's resident set size in MB (current on Linux; the peak where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS, KB elsewhere
        return peak / (2**20 if sys.platform == "darwin" else 2**10)


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Run the cyclic GC less often while inside: the search allocates many short-lived objects
    (freed by reference counting) and each full collection walks every graph and match alive."""
    threshold = gc.get_threshold()
    gc.set_threshold(max(threshold[0], 100_000), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


def backtracking_search(graph: Graph, rules: Sequence[Rule], coster: GraphCoster,
                        limits: SearchLimits = SearchLimits(),
                        progress: Callable[[SearchReport], None] | None = None) -> SearchReport:
    """Search for the cheapest equivalent graph reachable by applying ``rules``, within ``limits``: the
    search stops at ``budget`` expansions, after ``time_limit`` seconds, or once the process's RSS
    exceeds ``memory_limit_mb``, and returns the best graph found so far. With ``sweep``, each expansion
    also makes, for the rules of its ``sweep_rules`` cheapest children that have several improving
    matches, the children that apply all of them, in up to ``sweep_rounds`` rounds (see ``_sweep``).
    With ``patience``, it also stops once that many expansions in a row after a cheaper graph was found
    found no better one.

    With ``branches``, the sweeps made from the input graph that the best graph does not start with are
    searched on as roots of their own (up to that many, within the same time limit), and their best
    graphs come back as ``branches``: best-first search with alpha drops a branch whose first sweep
    costs a little more even when it leads much further (NasRNN: batching the steps first, 2.9x when
    measured end to end, against merging each gate's matmuls first, 1.9x), and measured costs of single
    kernels cannot always tell which, so ``xflow optimize`` times the branches end to end.

    A rule whose saving is in the values (``Rule.gain_in_values``) is not searched: estimates from costs measured
    on random inputs cannot see it (``xflow optimize`` times it end to end instead)."""
    start = time.perf_counter()
    targets = MatchTargets()
    rules = [rule for rule in rules if not rule.gain_in_values]
    with _fewer_collections():
        result = _search(graph, rules, coster, limits, limits.time_limit, progress, targets)
        # one branch per rule: the strict and the plateau sweep of one rule start the same way
        started = {result.steps[0].rule} if result.steps else set()
        for branch in result.root_sweeps:
            if len(result.branches) >= limits.branches:
                break
            if branch.steps[0].rule in started:
                continue  # the main search, or an earlier branch, started with this rule
            started.add(branch.steps[0].rule)
            if result.initial_cost - branch.cost < BRANCH_MIN_GAIN * result.initial_cost:
                continue  # too small a start for timing end to end to tell its end from the best's
            left = limits.time_limit - (time.perf_counter() - start)
            if left <= 0:
                break
            sub = _search(branch.graph.fresh(), rules, coster, limits, left, None, targets, result.graph.hash_sum)
            result.explored += sub.explored
            result.generated += sub.generated
            result.branches.append(Branch(sub.graph, sub.best_cost, branch.steps + sub.steps))
        result.branches.sort(key=lambda a: a.cost)
        result.seconds = time.perf_counter() - start
        result.cost_lookups, result.cost_hits = coster.lookups, coster.hits
    return result


def _search(graph: Graph, rules: Sequence[Rule], coster: GraphCoster, limits: SearchLimits, time_limit: float,
            progress: Callable[[SearchReport], None] | None, targets: MatchTargets,
            converged_at: int | None = None) -> SearchReport:
    alpha, budget, patience = limits.alpha, limits.budget, limits.patience
    start = time.perf_counter()
    initial_cost = coster.cost(graph)
    result = SearchReport(graph, initial_cost, initial_cost, (), StopReason.EXHAUSTED, 0, 0, 0.0)
    if not rules:
        result.stop_reason = StopReason.NO_RULES
        return result
    cap = max(int(len(graph.nodes) * limits.max_growth), len(graph.nodes) + 4)
    index = RuleIndex(rules)
    counter = itertools.count()
    root = _Entry(graph, (), matches=index.all_matches(graph))
    queue: list[tuple[float, int, _Entry]] = [(initial_cost, next(counter), root)]
    seen = {graph.hash_sum}
    change_costs: dict[tuple[tuple[Node, ...], tuple[Node, ...]], tuple[float, float]] = {}
    improved_at: int | None = None  # expansions done when the best graph last improved
    while queue:
        if converged_at is not None and converged_at in seen:
            result.stop_reason = StopReason.CONVERGED  # a branch that reached the main search's best graph
            break
        if result.explored >= budget:
            result.stop_reason = StopReason.BUDGET
            break
        # Before the first cheaper graph, crossing a plateau of costlier rewrites is the only way to one
        # (a chain of merges can cost more one at a time than all together): patience starts after it.
        if patience is not None and improved_at is not None and result.explored - improved_at >= patience:
            result.stop_reason = StopReason.PATIENCE
            break
        if time.perf_counter() - start > time_limit:
            result.stop_reason = StopReason.TIME
            break
        if limits.memory_limit_mb is not None and rss_mb() > limits.memory_limit_mb:
            result.stop_reason = StopReason.MEMORY
            break
        cost, _, entry = heapq.heappop(queue)
        result.explored += 1
        best_before = result.best_cost
        if isinstance(entry.graph, PendingGraph):
            assert entry.applied is not None
            entry.graph = _build(entry.graph, entry.applied, targets)
        if entry.matches is None:
            assert entry.parent is not None and entry.parent.matches is not None and entry.applied is not None
            entry.matches = derived_matches(entry.parent.graph, entry.parent.matches, entry.applied, entry.graph,
                                            index, entry.change)
        entry.parent = None  # the parent's matches are no longer needed through this entry
        parent = entry.graph
        assert isinstance(parent, Graph)
        steps = entry.steps
        # Children are costed and deduplicated before they are built: a child is a PendingGraph (its
        # hash, size, types and constant values come from the change) and becomes a Graph only when
        # it is popped or becomes the best, so children pruned by alpha x best are never built.
        children: list[tuple[Match, PendingGraph]] = []
        for match in entry.matches:
            if time.perf_counter() - start > time_limit:
                break
            child = _pending_child(parent, match, cap, seen, targets)
            if child is not None:
                seen.add(child.hash_sum)
                children.append((match, child))
        # all new nodes of children whose change was not costed before, in one batch (a measuring cost
        # model times them in one session)
        coster.prefetch([(child, child.change.added) for _, child in children
                         if child.change not in change_costs])
        improving: dict[str, list[tuple[Match, float]]] = {}
        near: dict[str, list[tuple[Match, float]]] = {}  # within alpha of the parent, for plateau sweeps
        for match, child in children:
            result.generated += 1
            child_cost = _derived_cost(coster, change_costs, parent, cost, child)
            if child_cost < cost:
                improving.setdefault(match.rule.name, []).append((match, child_cost))
            if child_cost < alpha * cost:
                near.setdefault(match.rule.name, []).append((match, child_cost))
            kept: Graph | PendingGraph = child
            if child_cost < result.best_cost * BETTER:
                kept = _build(child, match, targets)
                result.graph, result.best_cost, result.steps = kept, child_cost, steps + (_step(match),)
                result.trace.append((time.perf_counter() - start, child_cost))
            if child_cost < alpha * result.best_cost:
                heapq.heappush(queue, (child_cost, next(counter), _Entry(kept, steps, entry, match)))
        # The rules of the few cheapest single children are swept, each into a child of its own. Sweeping
        # only the cheapest one's rule commits the search to one structure, after which a better rewrite of
        # the other kind can fall outside alpha; sweeping every rule makes the search greedy for the rule
        # with the most copies.
        ranked = sorted(improving, key=lambda r: min(c for _, c in improving[r]))[
            :limits.sweep_rules if limits.sweep else 0]
        sweeps = [(matches, limit) for rule_name in ranked
                  for matches, limit in ((improving[rule_name], 1.0), (near[rule_name], alpha))
                  if len(matches) >= 2 and (limit == 1.0 or len(matches) > len(improving[rule_name]))]
        for matches, limit in sweeps:
            if time.perf_counter() - start > time_limit:
                break
            swept = _sweep(parent, cost, _in_sweep_order(parent, matches), index, coster, cap,
                           start + time_limit, limits.sweep_rounds, limit, targets)
            if swept is None or swept.graph.hash_sum in seen or swept.cost >= cost:
                continue
            seen.add(swept.graph.hash_sum)
            result.generated += 1
            sweep_steps = steps + tuple(_step(m) for m in swept.applied[:-1])
            sweep_entry = _Entry(swept.graph, sweep_steps, entry, swept.applied[-1], change=swept.change)
            if swept.cost < result.best_cost * BETTER:
                result.graph, result.best_cost, result.steps = swept.graph, swept.cost, sweep_entry.steps
                result.trace.append((time.perf_counter() - start, swept.cost))
            if entry is root:
                result.root_sweeps.append(Branch(swept.graph, swept.cost, sweep_entry.steps))
            if swept.cost < alpha * result.best_cost:
                heapq.heappush(queue, (swept.cost, next(counter), sweep_entry))
        if result.best_cost < best_before:
            improved_at = result.explored
        if progress is not None:
            result.seconds = time.perf_counter() - start
            progress(result)
    if result.steps:
        result.graph = result.graph.fresh()  # indexes updated through the search have another key order
    result.seconds = time.perf_counter() - start
    result.cost_lookups, result.cost_hits = coster.lookups, coster.hits
    return result

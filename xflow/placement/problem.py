"""What placement needs to know about a graph: node costs, tensors with their sizes, weights, edges."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from xflow.cost import AnalyticCost, CostModel
from xflow.cost.base import value_bytes
from xflow.ir import Graph


@dataclass(frozen=True)
class Tensor:
    """A value passed between nodes: its producer (-1 for a graph input), consumers and size."""

    name: str
    producer: int
    consumers: tuple[int, ...]
    nbytes: int
    is_output: bool


@dataclass(frozen=True, eq=False)
class Problem:
    """A graph reduced to what placement needs. Node ``i`` is ``graph.nodes[i]``; ``keys`` name
    nodes in plans (a node's first output, unique in a graph)."""

    graph: Graph
    costs: tuple[float, ...]
    ops: tuple[str, ...]
    keys: tuple[str, ...]
    tensors: tuple[Tensor, ...]
    weights: tuple[tuple[tuple[str, int], ...], ...]  # per node: (constant name, bytes) it reads
    name: str = "graph"

    @property
    def size(self) -> int:
        """Number of nodes."""
        return len(self.costs)

    @cached_property
    def inputs_of(self) -> tuple[tuple[int, ...], ...]:
        """Per node: indexes into ``tensors`` of the values it reads."""
        table: list[list[int]] = [[] for _ in self.costs]
        for t_index, t in enumerate(self.tensors):
            for c in t.consumers:
                table[c].append(t_index)
        return tuple(tuple(x) for x in table)

    @cached_property
    def outputs_of(self) -> tuple[tuple[int, ...], ...]:
        """Per node: indexes into ``tensors`` of the values it produces."""
        table: list[list[int]] = [[] for _ in self.costs]
        for t_index, t in enumerate(self.tensors):
            if t.producer >= 0:
                table[t.producer].append(t_index)
        return tuple(tuple(x) for x in table)

    @cached_property
    def weight_bytes(self) -> int:
        """Bytes of all weights, each counted once."""
        return sum(dict(w for ws in self.weights for w in ws).values())

    def key_index(self) -> dict[str, int]:
        """Plan key -> node index."""
        return {k: i for i, k in enumerate(self.keys)}


def build_problem(graph: Graph, cost_model: CostModel | None = None, name: str = "graph") -> Problem:
    """Reduce ``graph`` to a placement problem with node costs from ``cost_model`` (analytic by default)."""
    model = cost_model or AnalyticCost()
    costs = tuple(float(c) for c in model.node_costs(graph, graph.nodes))
    index = {n: i for i, n in enumerate(graph.nodes)}
    tensors: list[Tensor] = []
    weights: list[tuple[tuple[str, int], ...]] = []
    for n in graph.nodes:
        reads = [i for i in dict.fromkeys((*n.inputs, *n.implicit)) if i and graph.is_constant(i)]
        weights.append(tuple((w, value_bytes(graph.types.get(w))) for w in reads))
    produced = {o: index[n] for n in graph.nodes for o in n.outputs if o}
    for value, users in graph.users.items():
        if graph.is_constant(value) or (value not in produced and value not in graph.inputs):
            continue
        consumers = tuple(dict.fromkeys(index[u] for u, _ in users))
        tensors.append(Tensor(value, produced.get(value, -1), consumers, value_bytes(graph.types.get(value)),
                              value in graph.output_set))
    seen = {t.name for t in tensors}
    for value, producer in produced.items():  # values nobody reads (graph outputs, unused extras)
        if value not in seen:
            tensors.append(Tensor(value, producer, (), value_bytes(graph.types.get(value)),
                                  value in graph.output_set))
    keys = tuple(next((o for o in n.outputs if o), f"node{i}") for i, n in enumerate(graph.nodes))
    ops = tuple(n.onnx_type for n in graph.nodes)
    return Problem(graph, costs, ops, keys, tuple(tensors), tuple(weights), name)

"""An analytic cost model: FLOPs over a throughput, bytes over a bandwidth, plus a per-kernel overhead.
Deterministic and instant; used by tests and ``--cost analytic``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from xflow.cost.base import is_folded, value_bytes
from xflow.ir import Graph, Node
from xflow.ops import OPS


@dataclass
class AnalyticCost:
    """Roofline-style estimate; the defaults are in the range of a 2-core x86 server."""

    flops_per_second: float = 50e9
    bytes_per_second: float = 10e9
    overhead_seconds: float = 3e-6
    name: str = "analytic"
    fuses: bool = False  # cost groups as fused: an epilogue adds its arithmetic, not a pass over memory

    def node_cost(self, graph: Graph, node: Node) -> float:
        """Estimated seconds for one node."""
        if is_folded(graph, node):
            return 0.0  # folded into a constant before the model runs
        in_bytes = sum(value_bytes(graph.types.get(i)) for i in node.inputs if i)
        out_bytes = sum(value_bytes(graph.types.get(o)) for o in node.outputs if o)
        return (self.overhead_seconds + self._flops(graph, node) / self.flops_per_second
                + (in_bytes + out_bytes) / self.bytes_per_second)

    def node_costs(self, graph: Graph, nodes: Iterable[Node]) -> list[float]:
        """Estimated seconds per node."""
        return [self.node_cost(graph, n) for n in nodes]

    def group_costs(self, items: Sequence[tuple[Graph, tuple[Node, ...]]]) -> list[float]:
        """Estimated seconds per (graph, group): the head's cost plus each epilogue's arithmetic."""
        return [self.node_cost(graph, group[0]) + sum(self._flops(graph, n) for n in group[1:]) / self.flops_per_second
                for graph, group in items]

    @staticmethod
    def _flops(graph: Graph, node: Node) -> int:
        """The op table's FLOP count; for an opaque node, one per output element."""
        if node.is_opaque:
            return sum(value_bytes(graph.types.get(o)) // 4 for o in node.outputs if o)
        in_shapes = [graph.types[i].static_shape for i in node.inputs if i]
        out_shapes = [graph.types[o].static_shape for o in node.outputs if o]
        return OPS[node.op].count_flops(in_shapes, out_shapes, node.attrs)

"""Cost models: analytic (deterministic) and measured with ONNX Runtime (cached in SQLite)."""

from xflow.cost.analytic import AnalyticCost
from xflow.cost.base import CostModel, GraphCoster, node_key

__all__ = ["AnalyticCost", "CostModel", "GraphCoster", "node_key"]

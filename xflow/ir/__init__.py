"""The xflow graph IR."""

from xflow.ir.graph import CycleError, Graph, ModelContext, NodeChange, PendingGraph, topological_sort
from xflow.ir.node import OPAQUE, Node, Origin
from xflow.ir.tensor import Constant
from xflow.ir.types import FLOAT_DTYPES, Attrs, Shape, TensorType

__all__ = ["Attrs", "Constant", "CycleError", "FLOAT_DTYPES", "Graph", "ModelContext", "Node", "NodeChange",
           "OPAQUE", "Origin", "PendingGraph", "Shape", "TensorType", "topological_sort"]

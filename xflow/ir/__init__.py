"""The xflow graph IR."""

from xflow.ir.graph import CycleError, Graph, ModelContext, topological_sort
from xflow.ir.node import OPAQUE, Node, Origin
from xflow.ir.tensor import Constant
from xflow.ir.types import FLOAT_DTYPES, Attrs, Shape, TensorType

__all__ = ["Attrs", "Constant", "CycleError", "FLOAT_DTYPES", "Graph", "ModelContext", "Node", "OPAQUE",
           "Origin", "Shape", "TensorType", "topological_sort"]

"""Shape arithmetic over symbolic dims: fold what is known, share what is recomputed, delete what nothing reads.

A dynamic export computes its sizes at run time (``Shape -> Gather -> Unsqueeze -> Concat``, per layer, as the
exporter writes them). Each value of that arithmetic is a short vector (or a scalar) of integers; ``evaluate``
states each one as sympy expressions of the graph inputs' dims (the symbols of the IR's types, with the dims the
graph relates stated over the free ones: ``total_seq`` as ``past_seq + seq``). Then:

- a value whose expressions are all integers is the same at every size: it becomes an initializer (fold);
- a value whose expressions equal an earlier value's is that value at every size: its readers read the earlier
  one (share; what is left is one ``Shape`` read per input the sizes come from, the rest derived from it);
- shape nodes nothing reads any more go (delete).

The evaluator is the one place this module states ONNX's meaning of each op it reads (``_OPS``): a node it cannot
state exactly (an op outside the list, a float, a rank above 1, an index out of range, a division that is not
exact for every size) has no value, and stays as it is, with everything that reads it. ``check_step`` re-derives
a step's claims from the graph it applies to (each folded value's integers, each shared pair's expressions equal
as polynomials, hence for every value of the dims) and rebuilds the graph: ``xflow check`` redoes the step so."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import sympy

from xflow.ir import Graph, Node
from xflow.ir.dims import free_symbols
from xflow.ir.tensor import Constant
from xflow.ops import DEFAULT_DOMAINS

#: the most elements a value of shape arithmetic may hold here (shape vectors, not tensors)
MAX_ELEMENTS = 64
_INTS = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32})
_BOOL = onnx.TensorProto.BOOL


@dataclass(frozen=True)
class SymValue:
    """A value of shape arithmetic: element type, shape (``()`` or ``(n,)``) and each element as an expanded sympy
    expression over the dims (an integer, or ``sympy.true``/``false`` for a bool)."""

    dtype: int
    shape: tuple[int, ...]
    elems: tuple[Any, ...]

    @property
    def key(self) -> tuple[Any, ...]:
        """What equal values share: type, shape and expressions (expanded, so equal polynomials are equal)."""
        return (self.dtype, self.shape, self.elems)

    @property
    def is_static(self) -> bool:
        """True when every element is a number (the value is the same at every size)."""
        return all(isinstance(e, sympy.Integer | sympy.logic.boolalg.BooleanAtom) for e in self.elems)

    def array(self) -> np.ndarray:
        """The value of a static one, as ONNX Runtime holds it."""
        dtype = onnx.helper.tensor_dtype_to_np_dtype(self.dtype)
        items = [bool(e) if self.dtype == _BOOL else int(e) for e in self.elems]
        return np.array(items, dtype=dtype).reshape(self.shape)


def _value(dtype: int, shape: tuple[int, ...], elems: Sequence[Any]) -> SymValue | None:
    if len(elems) > MAX_ELEMENTS or len(shape) > 1:
        return None
    return SymValue(dtype, shape, tuple(e if isinstance(e, sympy.logic.boolalg.BooleanAtom) else sympy.expand(e)
                                        for e in elems))


def _from_array(array: np.ndarray) -> SymValue | None:
    dtype = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    if (dtype not in _INTS and dtype != _BOOL) or array.ndim > 1 or array.size > MAX_ELEMENTS:
        return None
    if dtype == _BOOL:
        return SymValue(dtype, array.shape, tuple(sympy.true if v else sympy.false for v in array.reshape(-1)))
    return SymValue(dtype, array.shape, tuple(sympy.Integer(int(v)) for v in array.reshape(-1)))


def _static_ints(v: SymValue | None) -> list[int] | None:
    if v is None or v.dtype not in _INTS or not v.is_static:
        return None
    return [int(e) for e in v.elems]


def _broadcast(*values: SymValue) -> tuple[tuple[int, ...], list[tuple[Any, ...]]] | None:
    """The broadcast shape of rank-0/1 values and each one's elements at every position of it."""
    try:
        shape = tuple(np.broadcast_shapes(*(v.shape for v in values)))
    except ValueError:
        return None
    n = int(np.prod(shape)) if shape else 1
    rows = [v.elems * n if len(v.elems) == 1 else v.elems for v in values]
    return shape, [tuple(r[i] for r in rows) for i in range(n)]


def _trunc_div(a: Any, b: Any) -> Any | None:
    """ONNX's integer Div (truncation toward zero) where it is exact for every size, or of two numbers."""
    if b == 0:
        return None
    if isinstance(a, sympy.Integer) and isinstance(b, sympy.Integer):
        q = abs(int(a)) // abs(int(b))
        return sympy.Integer(q if (int(a) >= 0) == (int(b) > 0) else -q)
    if not isinstance(b, sympy.Integer):
        return None
    q = sympy.expand(a / b)
    return q if all(c.is_integer for c in q.as_coefficients_dict().values()) else None


def _sign(d: Any) -> int | None:
    """+1 / -1 when a polynomial over dims (each >= 0) is positive / negative at every size, 0 when it is 0;
    None when that depends on the sizes."""
    if d == 0:
        return 0
    terms = sympy.expand(d).as_coefficients_dict()
    constant = terms.get(sympy.Integer(1), 0)
    others = [c for m, c in terms.items() if m != 1]
    if not all(c.is_number for c in terms.values()):
        return None
    if constant > 0 and all(c >= 0 for c in others):
        return 1
    if constant < 0 and all(c <= 0 for c in others):
        return -1
    return None


def _attrs(proto: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute}


def _axes(proto: onnx.NodeProto, ins: Sequence[SymValue | None], attrs: Mapping[str, Any]) -> list[int] | None:
    if "axes" in attrs:
        return list(attrs["axes"])
    if len(ins) > 1 and proto.input[1]:
        return _static_ints(ins[1])
    return []


def _shape(node: Node, proto: onnx.NodeProto, ins: Sequence[SymValue | None], attrs: Mapping[str, Any],
           dims_of: Callable[[str], tuple[Any, ...] | None]) -> SymValue | None:
    dims = dims_of(proto.input[0])
    if dims is None:
        return None
    rank = len(dims)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start, end = (max(0, min(rank, x + rank if x < 0 else x)) for x in (start, end))
    picked = dims[start:end]
    return _value(onnx.TensorProto.INT64, (len(picked),), picked)


def _gather(node: Node, proto: onnx.NodeProto, ins: Sequence[SymValue | None], attrs: Mapping[str, Any],
            dims_of: Callable[[str], tuple[Any, ...] | None]) -> SymValue | None:
    data, indices = ins[0], _static_ints(ins[1])
    if data is None or len(data.shape) != 1 or indices is None or attrs.get("axis", 0) not in (0, -1):
        return None
    n = data.shape[0]
    picked = [i + n if i < 0 else i for i in indices]
    if any(not 0 <= i < n for i in picked):
        return None
    assert ins[1] is not None
    return _value(data.dtype, ins[1].shape, [data.elems[i] for i in picked])


def _slice(node: Node, proto: onnx.NodeProto, ins: Sequence[SymValue | None], attrs: Mapping[str, Any],
           dims_of: Callable[[str], tuple[Any, ...] | None]) -> SymValue | None:
    data = ins[0]
    if data is None or len(data.shape) != 1:
        return None
    if "starts" in attrs:  # opset < 10
        starts, ends, axes, steps = list(attrs["starts"]), list(attrs["ends"]), list(attrs.get("axes", [0])), [1]
    else:
        given = [_static_ints(ins[i]) if i < len(ins) and proto.input[i] else None for i in range(1, 5)]
        starts, ends = given[0], given[1]
        axes = given[2] if len(ins) > 3 and proto.input[3] else [0]
        steps = given[3] if len(ins) > 4 and proto.input[4] else [1]
    if starts is None or ends is None or axes is None or steps is None:
        return None
    if len(starts) != 1 or len(ends) != 1 or axes not in ([0], [-1]) or len(steps) != 1 or steps[0] <= 0:
        return None
    # with a positive step ONNX clamps starts and ends (negative ones counted from the end) as Python does
    picked = data.elems[slice(starts[0], ends[0], steps[0])]
    return _value(data.dtype, (len(picked),), picked)


def _unsqueeze(node: Node, proto: onnx.NodeProto, ins: Sequence[SymValue | None], attrs: Mapping[str, Any],
               dims_of: Callable[[str], tuple[Any, ...] | None]) -> SymValue | None:
    data, axes = ins[0], _axes(proto, ins, attrs)
    if data is None or data.shape != () or axes not in ([0], [-1]):
        return None
    return _value(data.dtype, (1,), data.elems)


def _squeeze(node: Node, proto: onnx.NodeProto, ins: Sequence[SymValue | None], attrs: Mapping[str, Any],
             dims_of: Callable[[str], tuple[Any, ...] | None]) -> SymValue | None:
    data, axes = ins[0], _axes(proto, ins, attrs)
    if data is None or data.shape != (1,) or axes not in ([], [0], [-1]):
        return None
    return _value(data.dtype, (), data.elems)


def _concat(node: Node, proto: onnx.NodeProto, ins: Sequence[SymValue | None], attrs: Mapping[str, Any],
            dims_of: Callable[[str], tuple[Any, ...] | None]) -> SymValue | None:
    if not ins or any(v is None or len(v.shape) != 1 for v in ins) or attrs.get("axis") not in (0, -1):
        return None
    values = [v for v in ins if v is not None]
    if len({v.dtype for v in values}) != 1:
        return None
    elems = [e for v in values for e in v.elems]
    return _value(values[0].dtype, (len(elems),), elems)


def _arithmetic(op: Callable[[Any, Any], Any | None]) -> Callable[..., SymValue | None]:
    def evaluate(node: Node, proto: onnx.NodeProto, ins: Sequence[SymValue | None], attrs: Mapping[str, Any],
                 dims_of: Callable[[str], tuple[Any, ...] | None]) -> SymValue | None:
        spread = _int_pairs(ins)
        if spread is None:
            return None
        dtype, shape, rows = spread
        elems = [op(x, y) for x, y in rows]
        return None if any(e is None for e in elems) else _value(dtype, shape, elems)
    return evaluate


def _int_pairs(ins: Sequence[SymValue | None]) -> tuple[Any, tuple[int, ...], list[tuple[Any, Any]]] | None:
    """Two integer operands of one dtype, broadcast: (dtype, shape, the element pairs), or None."""
    a, b = ins
    if a is None or b is None or a.dtype != b.dtype or a.dtype not in _INTS:
        return None
    spread = _broadcast(a, b)
    return None if spread is None else (a.dtype, *spread)


def _equal(node: Node, proto: onnx.NodeProto, ins: Sequence[SymValue | None], attrs: Mapping[str, Any],
           dims_of: Callable[[str], tuple[Any, ...] | None]) -> SymValue | None:
    spread = _int_pairs(ins)
    if spread is None:
        return None
    _dtype, shape, rows = spread
    signs = [_sign(x - y) for x, y in rows]
    if any(s is None for s in signs):
        return None
    return _value(_BOOL, shape, [sympy.true if s == 0 else sympy.false for s in signs])


def _where(node: Node, proto: onnx.NodeProto, ins: Sequence[SymValue | None], attrs: Mapping[str, Any],
           dims_of: Callable[[str], tuple[Any, ...] | None]) -> SymValue | None:
    cond, a, b = ins
    if cond is None or a is None or b is None or cond.dtype != _BOOL or not cond.is_static or a.dtype != b.dtype:
        return None
    spread = _broadcast(cond, a, b)
    if spread is None:
        return None
    shape, rows = spread
    return _value(a.dtype, shape, [x if c else y for c, x, y in rows])


def _cast(node: Node, proto: onnx.NodeProto, ins: Sequence[SymValue | None], attrs: Mapping[str, Any],
          dims_of: Callable[[str], tuple[Any, ...] | None]) -> SymValue | None:
    data = ins[0]
    if data is None or data.dtype not in _INTS or attrs.get("to") not in _INTS:
        return None  # dims are far inside int32's range: int casts keep every value
    return _value(int(attrs["to"]), data.shape, data.elems)


def _identity(node: Node, proto: onnx.NodeProto, ins: Sequence[SymValue | None], attrs: Mapping[str, Any],
              dims_of: Callable[[str], tuple[Any, ...] | None]) -> SymValue | None:
    return ins[0]


def _constant(node: Node, proto: onnx.NodeProto, ins: Sequence[SymValue | None], attrs: Mapping[str, Any],
              dims_of: Callable[[str], tuple[Any, ...] | None]) -> SymValue | None:
    value = attrs.get("value")
    if not isinstance(value, onnx.TensorProto) or len(attrs) != 1:
        return None
    return _from_array(onnx.numpy_helper.to_array(value))


#: ONNX's meaning of each op this module reads, on values of rank 0 or 1 (None: not stated exactly here)
_OPS: dict[str, Callable[..., SymValue | None]] = {
    "Shape": _shape, "Gather": _gather, "Slice": _slice, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Concat": _concat, "Add": _arithmetic(lambda x, y: x + y), "Sub": _arithmetic(lambda x, y: x - y),
    "Mul": _arithmetic(lambda x, y: x * y), "Div": _arithmetic(_trunc_div), "Equal": _equal, "Where": _where,
    "Cast": _cast, "Identity": _identity, "Constant": _constant,
}


#: deterministic ops whose output is a function of their inputs and attributes alone: two such nodes with equal
#: attributes on the same inputs compute one value (the rotary Range and the causal-mask Slice every layer repeats)
PURE = frozenset(_OPS) | {
    "Range", "ConstantOfShape", "Expand", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Or", "And", "Not",
    "Neg", "Tile", "Transpose", "Reshape", "CumSum", "Min", "Max", "Abs", "Mod", "Trilu", "Sqrt", "Reciprocal",
    "Pow", "Softmax", "Sigmoid", "Tanh", "Exp", "Log", "Erf", "ReduceMean", "ReduceSum", "ReduceProd",
}


def _proto(node: Node, ops: frozenset[str] | Mapping[str, Any] = _OPS) -> onnx.NodeProto | None:
    """The ONNX node of a shape-arithmetic candidate: an opaque standard-domain node without subgraphs, one
    output, of an op the evaluator states (of ``ops``)."""
    if not node.is_opaque or node.origin is None or node.implicit or len(node.outputs) != 1:
        return None
    proto = node.origin.proto
    if proto.domain not in DEFAULT_DOMAINS or proto.op_type not in ops:
        return None
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in proto.attribute):
        return None
    return proto


def evaluate(graph: Graph) -> dict[str, SymValue]:
    """The values of the graph's shape arithmetic (small integer constants included), by name: each element an
    expanded sympy expression over the symbols of the graph inputs' dims."""
    input_symbols = {s for name in graph.inputs if (t := graph.types.get(name)) is not None and t.shape is not None
                     for s in free_symbols(t.shape)}

    def dims_of(name: str) -> tuple[Any, ...] | None:
        t = graph.types.get(name)
        if t is None or t.shape is None or any(d is None for d in t.shape):
            return None
        if not set(free_symbols(t.shape)) <= input_symbols:
            return None
        return tuple(sympy.Integer(d) if isinstance(d, int) else d for d in t.shape)

    values: dict[str, SymValue] = {}
    for name, const in graph.constants.items():
        if graph.is_constant(name) and not const.is_external and const.type.shape is not None \
                and const.type.size <= MAX_ELEMENTS:
            found = _from_array(const.value())
            if found is not None:
                values[name] = found
    for node in graph.nodes:
        proto = _proto(node)
        if proto is None:
            continue
        ins = [values.get(i) if i else None for i in node.inputs]
        try:
            found = _OPS[proto.op_type](node, proto, ins, _attrs(proto), dims_of)
        except (TypeError, ValueError, IndexError, KeyError):  # a malformed node has no value here
            found = None
        declared = graph.types.get(node.outputs[0])
        if found is not None and declared is not None and (
                declared.dtype != found.dtype
                or (declared.shape is not None and len(declared.shape) != len(found.shape))):
            found = None  # what the model declares wins: a disagreement means this is not the ONNX meaning
        if found is not None:
            values[node.outputs[0]] = found
    return values


@dataclass(frozen=True)
class ShapeStep:
    """One fold-share-delete of a graph's shape arithmetic: the values folded (name -> value), the values shared
    (name -> the earlier value its readers now read), the nodes deleted (by label) and the graph made."""

    constants: dict[str, SymValue]
    shared: dict[str, str]
    removed: tuple[str, ...]
    graph: Graph

    def record(self) -> dict[str, Any]:
        """What the certificate states of the step."""
        return {"kind": "shapes",
                "constants": {name: {"dtype": v.dtype, "shape": list(v.shape),
                                     "values": [bool(e) if v.dtype == _BOOL else int(e) for e in v.elems]}
                              for name, v in sorted(self.constants.items())},
                "shared": dict(sorted(self.shared.items())), "removed": list(self.removed),
                "graph": self.graph.structural_hash}


def _captured(graph: Graph) -> set[str]:
    return {name for n in graph.nodes for name in n.implicit}


def _candidates(graph: Graph, values: Mapping[str, SymValue]) -> dict[str, Node]:
    """The shape nodes whose value is known and may be replaced: by output name (graph outputs and values a
    subgraph reads keep their nodes)."""
    captured = _captured(graph)
    return {n.outputs[0]: n for n in graph.nodes if _proto(n, PURE) is not None
            and n.outputs[0] not in graph.output_set and n.outputs[0] not in captured}


def _same_node_key(node: Node, shared: Mapping[str, str]) -> tuple[Any, ...]:
    """What two pure nodes computing one value share: op and attributes (the proto without names) and inputs
    (after the sharing so far)."""
    return ("node", node.signature(), tuple(shared.get(i, i) for i in node.inputs))


def share_shapes(graph: Graph) -> ShapeStep | None:
    """Fold, share and delete ``graph``'s shape arithmetic (the module's doc); None when it changes nothing."""
    values = evaluate(graph)
    candidates = _candidates(graph, values)
    # with control flow, a value made an initializer lets ONNX Runtime pick If branches at load and then check the
    # branch not taken against it (``xflow.onnx_io.known_values``): there nothing folds, sharing still holds
    fold = not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                   for n in graph.nodes if n.is_opaque and n.origin is not None for a in n.origin.proto.attribute)
    constants: dict[str, SymValue] = {}
    shared: dict[str, str] = {}
    first: dict[tuple[Any, ...], str] = {}
    for name, node in candidates.items():
        value = values.get(name)
        key = value.key if value is not None else _same_node_key(node, shared)
        if value is not None and value.is_static:
            if fold and _proto(node).op_type != "Constant":  # type: ignore[union-attr]
                constants[name] = value
        elif key in first:
            shared[name] = first[key]
        else:
            first[key] = name
    made, removed = apply_step(graph, constants, shared)
    if not removed and not shared:
        return None
    return ShapeStep(constants, shared, removed, made)


def apply_step(graph: Graph, constants: Mapping[str, SymValue], shared: Mapping[str, str]
               ) -> tuple[Graph, tuple[str, ...]]:
    """``graph`` with ``constants`` as initializers (their nodes gone), the readers of each ``shared`` value
    reading the value it names, and then every shape node nothing reads deleted; and the deleted nodes' labels."""
    replaced = set(constants) | set(shared)
    nodes: list[Node] = []
    removed: list[str] = []
    for node in graph.nodes:
        if _proto(node, PURE) is not None and node.outputs[0] in replaced:
            removed.append(node.label)
            continue
        if any(i in shared for i in node.inputs):
            node = dataclasses.replace(node, inputs=tuple(shared.get(i, i) for i in node.inputs))
        nodes.append(node)
    read = set(graph.outputs)
    kept: list[Node] = []
    for node in reversed(nodes):  # readers come after what they read: one pass backwards deletes whole chains
        if _proto(node, PURE) is not None and not (set(node.outputs) & read):
            removed.append(node.label)
            continue
        kept.append(node)
        read.update(i for i in (*node.inputs, *node.implicit) if i)
    # in the order of their names, so that a replay, which reads them from the certificate sorted, writes the
    # model's initializers in the order the run wrote them
    made = graph.with_nodes(reversed(kept), constants={name: Constant.from_array(v.array())
                                                      for name, v in sorted(constants.items())})
    return made, tuple(sorted(removed))


def check_step(graph: Graph, step: Mapping[str, Any]) -> Graph:
    """The graph a certificate's ``shapes`` step makes of ``graph``, its claims re-derived from ``graph`` with the
    evaluator: each folded value's integers, each shared pair's expressions equal, the nodes deleted those nothing
    reads, the graph made the one stated. ValueError naming the first claim that fails."""
    values = evaluate(graph)
    candidates = _candidates(graph, values)
    constants: dict[str, SymValue] = {}
    for name, stated in step.get("constants", {}).items():
        value = values.get(name)
        if name not in candidates or value is None or not value.is_static:
            raise ValueError(f"{name} is not a value of shape arithmetic the same at every size")
        if [value.dtype, list(value.shape), value.array().reshape(-1).tolist()] != \
                [stated.get("dtype"), stated.get("shape"), stated.get("values")]:
            raise ValueError(f"{name} recomputed is {value.array().tolist()}, not the value stated")
        constants[name] = value
    position = graph.position
    shared: dict[str, str] = {}
    stated_shared = step.get("shared", {})
    for name, target in stated_shared.items():
        if name not in candidates or target in stated_shared:
            raise ValueError(f"{name} -> {target} is not a pair of values of pure nodes")
        if name in values:
            if target not in values or values[name].key != values[target].key:
                raise ValueError(f"{name} is {list(values[name].elems)}, {target} is "
                                 f"{list(values[target].elems) if target in values else 'not shape arithmetic'}: "
                                 "not equal at every size")
        elif target not in candidates or \
                _same_node_key(candidates[name], stated_shared) != _same_node_key(candidates[target], stated_shared):
            raise ValueError(f"{name} and {target} are not the same op on the same inputs")
        producer = graph.producers.get(target)
        if producer is not None and position[producer] >= position[candidates[name]]:
            raise ValueError(f"{target} is computed after {name}")
        shared[name] = target
    made, removed = apply_step(graph, constants, shared)
    if list(removed) != list(step.get("removed", [])):
        raise ValueError("the nodes deleted are not those nothing reads")
    if made.structural_hash != step.get("graph"):
        raise ValueError("the graph made is not the one stated")
    return made


def shape_node_count(graph: Graph) -> int:
    """How many nodes of ``graph`` compute shape arithmetic the evaluator states (``Constant`` nodes aside)."""
    values = evaluate(graph)
    return sum(1 for n in graph.nodes if (p := _proto(n)) is not None and p.op_type != "Constant"
               and n.outputs[0] in values)

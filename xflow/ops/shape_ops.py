"""Data movement: concat, split, reshape (to a shape whose dims may be expressions over the symbols)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape
from xflow.ir.dims import as_dim, equal, exact_quotient, free_symbols, is_static, product
from xflow.ops._runtime_dims import runtime_shape, writable
from xflow.ops.base import (
    VARIADIC,
    AttrSpec,
    DecodeContext,
    EncodeContext,
    Generalize,
    Menu,
    OpDef,
    ShapeError,
    ShapeFacts,
    make_node,
    normalize_axis,
    onnx_attrs,
    symbolic_shape,
)


def concat_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Inputs agree on every dim but ``axis``, which adds up."""
    axis = attrs["axis"]
    first = shapes[0]
    if not 0 <= axis < len(first):
        raise ShapeError(f"concat: axis {axis} out of range for rank {len(first)}")
    for s in shapes[1:]:
        if len(s) != len(first) or any(a != b for i, (a, b) in enumerate(zip(s, first, strict=True)) if i != axis):
            raise ShapeError(f"concat: shapes {list(shapes)} differ off axis {axis}")
    return [first[:axis] + (sum(s[axis] for s in shapes),) + first[axis + 1:]]


def concat_fit(shapes: Sequence[Shape], attrs: Attrs, free: frozenset[int]) -> list[Shape] | None:
    """Free inputs given a fixed input's dims off the axis (the first input's when all are free), keeping their own
    size along it."""
    axis = attrs["axis"]
    reference = next((tuple(s) for i, s in enumerate(shapes) if i not in free), tuple(shapes[0]))
    if not 0 <= axis < len(reference):
        return None
    return [reference[:axis] + (s[axis] if axis < len(s) else reference[axis],) + reference[axis + 1:]
            if i in free else s for i, s in enumerate(shapes)]


def _axis_facts(f: ShapeFacts, attrs: Mapping[str, Any], args: Sequence[Any]) -> list[Any]:
    axis = attrs.get("axis")
    if axis is None:
        return []
    return [axis >= 0, axis < f.rank(args[0])] if f.symbolic(axis) else [f.rank(args[0]) > axis]


def concat_facts(f: ShapeFacts, attrs: Mapping[str, Any], args: Sequence[Any]) -> list[Any]:
    """The axis is one of the first input's, and every input has its rank."""
    if attrs.get("axis") is None:
        return []
    return _axis_facts(f, attrs, args) + [f.rank(a) == f.rank(args[0]) for a in args[1:]]


def _sample_axis(rng: np.random.Generator, shapes: Sequence[Shape], chosen: Mapping[str, Any], n_out: int) -> Any:
    rank = len(shapes[0]) if shapes else 0
    return int(rng.integers(rank)) if rank else None


def decode_concat(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Concat with a normalized (non-negative) axis."""
    shape = symbolic_shape(ctx, proto.input[0])
    if shape is None:
        return None
    axis = normalize_axis(int(onnx_attrs(proto)["axis"]), len(shape))
    return [make_node(proto, CONCAT, proto.input, proto.output, {"axis": axis})]


def encode_concat(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Concat."""
    return [onnx.helper.make_node("Concat", list(node.inputs), list(node.outputs),
                                  name=node.name or ctx.fresh_name("Concat"), axis=node.attrs["axis"])]


def split_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Cut ``axis`` into pieces of the sizes in ``split``."""
    (x,) = shapes
    axis, sizes = attrs["axis"], attrs["split"]
    if not 0 <= axis < len(x):
        raise ShapeError(f"split: axis {axis} out of range for rank {len(x)}")
    if any(s < 0 for s in sizes) or sum(sizes) != x[axis]:
        raise ShapeError(f"split: sizes {sizes} do not add up to dim {x[axis]} of {x}")
    return [x[:axis] + (s,) + x[axis + 1:] for s in sizes]


def split_fit(shapes: Sequence[Shape], attrs: Attrs, free: frozenset[int]) -> list[Shape] | None:
    """A free input's dim along the axis made the sizes' sum."""
    (x,) = shapes
    axis, sizes = attrs["axis"], attrs["split"]
    if 0 not in free or not 0 <= axis < len(x):
        return None
    return [tuple(x[:axis]) + (sum(sizes),) + tuple(x[axis + 1:])]


def split_facts(f: ShapeFacts, attrs: Mapping[str, Any], args: Sequence[Any]) -> list[Any]:
    """The axis is one of the input's, and the sizes are non-negative and add up to its dim there."""
    if attrs.get("axis") is None:
        return []
    facts = _axis_facts(f, attrs, args)
    sizes = attrs.get("split")
    if isinstance(sizes, tuple):
        facts += [f.int(v) >= 0 for v in sizes]
        total: Any = 0
        for v in sizes:
            total = total + v
        facts.append(f.int(total) == f.dim(args[0], attrs["axis"]))
    return facts


def _sample_sizes(rng: np.random.Generator, shapes: Sequence[Shape], chosen: Mapping[str, Any], n_out: int) -> Any:
    total = shapes[0][chosen["axis"]]
    if n_out > total:
        return None
    cuts = sorted(int(c) for c in rng.choice(np.arange(1, total), size=n_out - 1, replace=False)) \
        if n_out > 1 else []
    bounds = [0, *cuts, total]
    return tuple(b - a for a, b in zip(bounds, bounds[1:], strict=False))


def _menu_halves(params: dict[str, Any], shapes: Sequence[Shape]) -> dict[str, Any] | None:
    """A split menu entry cuts its axis in two halves."""
    attrs = dict(params)
    axis = attrs["axis"]
    if not shapes or axis >= len(shapes[0]) or shapes[0][axis] < 2:
        return None
    d = shapes[0][axis]
    attrs["split"] = (d // 2, d - d // 2)
    return attrs


def nested_split_attrs(outer: Attrs, piece: int, inner: Attrs) -> Attrs | None:
    """The attributes of one split that does what ``outer`` followed by ``inner`` on its output
    ``piece`` does (the inner pieces take that piece's place); None when they cut different axes."""
    if outer["axis"] != inner["axis"]:
        return None
    return split_attrs(outer["axis"], outer["split"][:piece] + inner["split"] + outer["split"][piece + 1:])


def split_attrs(axis: int, sizes: Sequence[int]) -> Attrs:
    """The attributes of a split along ``axis`` into pieces of ``sizes``."""
    return Attrs({"axis": axis, "split": tuple(int(s) for s in sizes)})


def _split(xp, a, attrs):
    bounds = np.cumsum(attrs["split"])[:-1].tolist()
    return list(xp.split(a[0], bounds, axis=attrs["axis"]))


def _static_axis(shapes: Sequence[Shape], axis: int, what: str) -> None:
    """ValueError where an input's dim along ``axis`` is a symbol: the term check takes symbolic dims at two sizes,
    which stands for all sizes only along the axes an op does not cut."""
    for shape in shapes:
        if shape is None or not isinstance(shape[axis % len(shape)], int):
            raise ValueError(f"{what} is a symbolic dim")


def _split_terms(args: Sequence[np.ndarray], attrs: Attrs, shapes: Sequence[Shape], tag: Any) -> list[np.ndarray]:
    """A split moves elements: its pieces' terms are its input's, cut where the sizes say (``TermRule``)."""
    _static_axis(shapes, attrs["axis"], "a split's axis")
    if sum(attrs["split"]) != args[0].shape[attrs["axis"] % args[0].ndim]:
        raise ValueError("a split's sizes do not cut its input")
    return _split(np, args, attrs)


def _concat_terms(args: Sequence[np.ndarray], attrs: Attrs, shapes: Sequence[Shape], tag: Any) -> list[np.ndarray]:
    """A concat moves elements: its output's terms are its inputs', side by side (``TermRule``)."""
    _static_axis(shapes, attrs["axis"], "a concat's axis")
    return [np.concatenate(list(args), axis=attrs["axis"])]


def decode_split(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Split with sizes from the attribute (opset < 13), the constant input, or num_outputs."""
    shape = symbolic_shape(ctx, proto.input[0])
    if shape is None or any(not o for o in proto.output):
        return None
    attrs = onnx_attrs(proto)
    axis = normalize_axis(int(attrs.get("axis", 0)), len(shape))
    n = len(proto.output)
    if "split" in attrs:
        sizes = [int(s) for s in attrs["split"]]
    elif len(proto.input) > 1 and proto.input[1]:
        value = ctx.constant_value(proto.input[1])
        if value is None:
            return None
        sizes = [int(s) for s in value.reshape(-1)]
    else:
        step = -(-shape[axis] // n)  # ONNX: ceil division, last piece smaller
        sizes = [min(step, shape[axis] - i * step) for i in range(n)]
    if len(sizes) != n:
        return None
    return [make_node(proto, SPLIT, proto.input[:1], proto.output, {"axis": axis, "split": tuple(sizes)})]


def encode_split(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Split: sizes as an attribute before opset 13, as a constant input from 13 on."""
    name = node.name or ctx.fresh_name("Split")
    sizes = list(node.attrs["split"])
    if ctx.opset < 13:
        return [onnx.helper.make_node("Split", list(node.inputs), list(node.outputs), name=name,
                                      axis=node.attrs["axis"], split=sizes)]
    sizes_name = ctx.add_constant(np.array(sizes, dtype=np.int64), f"{name}_sizes")
    return [onnx.helper.make_node("Split", [node.inputs[0], sizes_name], list(node.outputs), name=name,
                                  axis=node.attrs["axis"])]


def reshape_shape(shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
    """Reshape to the explicit ``shape`` (no 0 or -1: decoding resolves them). A target with dims over
    symbols must be one the encoder can write (``writable_reshape_target``)."""
    (x,) = shapes
    target = tuple(attrs["shape"])
    if any(is_static(d) and d < 0 for d in target) or not equal(product(target), product(x)):
        raise ShapeError(f"reshape: cannot reshape {x} to {target}")
    if not writable_reshape_target(x, target):
        raise ShapeError(f"reshape: target {target} of {x} cannot be written (a dim not an integer polynomial "
                         "in the input's symbols, or a 0 beside symbols)")
    return [target]


def writable_reshape_target(x: Shape, target: Shape) -> bool:
    """Whether ``encode_reshape`` can write a Reshape of a value of dims ``x`` to ``target`` for every value of
    the symbols: as one constant ONNX target (``onnx_reshape_target``), or with a target computed at run
    time, which needs every symbolic dim an integer polynomial over symbols of ``x`` (each of them read from a
    graph input's dim, as every symbol in the IR is: ``xflow.ops._runtime_dims``) and no static 0 beside them
    (a computed 0 would copy the input's dim)."""
    if onnx_reshape_target(x, target) is not None:
        return True
    if any(is_static(d) and int(d) == 0 for d in target):
        return False
    return set(free_symbols(target)) <= set(free_symbols(x)) and all(writable(d) for d in target)


def onnx_reshape_target(x: Shape, target: Shape) -> tuple[int, ...] | None:
    """The constant ONNX Reshape target (``allowzero`` 0) that reshapes a value of dims ``x`` to ``target``
    for every value of the symbols: a static dim as it is, a symbolic dim equal to the input's at the same
    axis as 0 (copy it), one other dim as -1 (the rest of the elements, which the element count of
    ``target`` fixes); None when that does not cover it (two symbolic dims that are not copied, or a static 0
    beside symbols, which 0 would copy instead)."""
    if all(is_static(d) for d in target):
        return tuple(int(d) for d in target)
    written: list[int] = []
    for axis, d in enumerate(target):
        if is_static(d):
            if int(d) == 0:
                return None
            written.append(int(d))
        elif axis < len(x) and equal(d, x[axis]):
            written.append(0)
        elif -1 in written:
            return None
        else:
            written.append(-1)
    return tuple(written)


def decode_reshape(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
    """Reshape whose target shape is a constant, or computed from the input's dims (a Shape -> Gather ->
    Concat chain of a dynamic export) where the output's dims are known over the symbols; 0 and -1 are
    resolved against the input. The chain stays as it is; the reshape reads only its data."""
    shape = symbolic_shape(ctx, proto.input[0])
    target = ctx.constant_value(proto.input[1]) if len(proto.input) > 1 else None
    out = symbolic_shape(ctx, proto.output[0])
    if shape is None or out is None or len(proto.input) < 2:
        return None
    if target is None and all(is_static(d) for d in out):
        return None  # a computed target with a static result: its value may still depend on the input's
    allowzero = int(onnx_attrs(proto).get("allowzero", 0))
    if allowzero and (target is None or 0 in target.tolist()):
        return None
    if target is not None and not all(is_static(d) for d in out):
        # inference may not know what a -1 stands for beside a symbolic dim (Swin's windows, ``-1`` for
        # ``64*batch``): the constant target says it; the loader checks it against whatever inference knows
        out = resolved_target(shape, [int(t) for t in target.reshape(-1)]) or out
    return [make_node(proto, RESHAPE, proto.input[:1], proto.output, {"shape": tuple(out)})]


def resolved_target(x: Shape, target: Sequence[int]) -> Shape | None:
    """The dims of an ONNX Reshape (``allowzero`` 0) of a value of dims ``x`` to the constant ``target``: 0
    copies the input's dim, -1 is the rest of the elements; None when the -1 does not divide exactly for every
    value of the symbols (or the target is malformed)."""
    if target.count(-1) > 1 or any(t < -1 for t in target) or any(t == 0 and i >= len(x) for i, t in
                                                                   enumerate(target)):
        return None
    dims = [x[i] if t == 0 else t for i, t in enumerate(target)]
    if -1 not in dims:
        return tuple(dims)
    quotient = exact_quotient(product(x), product([d for d in dims if not (is_static(d) and d == -1)]))
    if quotient is None:
        return None
    return tuple(as_dim(quotient) if is_static(d) and d == -1 else d for d in dims)


def encode_reshape(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
    """ONNX Reshape with the target shape as a constant input (0 and -1 where it has symbolic dims), or, when
    one constant cannot say it (``[batch*seq, 768]`` back to ``[batch, seq, 768]``), computed at run time
    from the graph inputs' dims (``computed_reshape_target``)."""
    name = node.name or ctx.fresh_name("Reshape")
    target = tuple(node.attrs["shape"])
    protos: list[onnx.NodeProto] = []
    if all(is_static(d) for d in target):
        shape_name = ctx.add_constant(np.array(target, dtype=np.int64), f"{name}_shape")
    else:
        source = ctx.type_of(node.inputs[0])
        if source is None or source.shape is None:
            raise ValueError(f"reshape {node.name}: the input's dims are unknown, no target for {target}")
        written = onnx_reshape_target(source.shape, target)
        if written is not None:
            shape_name = ctx.add_constant(np.array(written, dtype=np.int64), f"{name}_shape")
        else:
            protos, shape_name = computed_reshape_target(source.shape, target, name, ctx)
    return [*protos, onnx.helper.make_node("Reshape", [node.inputs[0], shape_name], list(node.outputs), name=name)]


def computed_reshape_target(x: Shape, target: Shape, name: str, ctx: EncodeContext
                            ) -> tuple[list[onnx.NodeProto], str]:
    """ONNX nodes computing the Reshape target ``target`` for an input of dims ``x`` at run time, and the
    name of their result: dims copied from the input as 0, the first other symbolic dim as -1, the rest
    computed (``_runtime_dims.runtime_shape``). ValueError on a static 0 beside symbols (a computed target's
    0 would copy the input's dim; ``writable_reshape_target`` rules it out)."""
    pieces: list[Any] = []
    for axis, d in enumerate(target):
        if is_static(d):
            if int(d) == 0:
                raise ValueError(f"reshape {name}: a static 0 beside symbolic dims in {target}")
            pieces.append(int(d))
        elif axis < len(x) and equal(d, x[axis]):
            pieces.append(0)
        elif -1 not in pieces:
            pieces.append(-1)
        else:
            pieces.append(d)
    return runtime_shape(pieces, f"{name}_shape", ctx)


#: concat's and split's axis: one variable when the generator generalizes it, so the two stay equal
AXIS = AttrSpec("axis", sample=_sample_axis, generalize=Generalize("axis", (0, 1, 2, 3)))

CONCAT = OpDef(
    name="concat", onnx_types=("Concat",), min_inputs=1, max_inputs=VARIADIC,
    attrs=(AXIS,),
    shape=concat_shape, kernel=lambda xp, a, attrs: [xp.concatenate(list(a), axis=attrs["axis"])],
    decode=decode_concat, encode=encode_concat, doc="concatenate along axis", z3_symbol="concat",
    facts=concat_facts, menu=Menu(({"axis": 0}, {"axis": 1}), arity=2), family="layout", fit=concat_fit,
    terms=_concat_terms)

SPLIT = OpDef(
    name="split", onnx_types=("Split",), min_inputs=1, max_inputs=1,
    attrs=(AXIS, AttrSpec("split", z3="sizes", sample=_sample_sizes)),
    shape=split_shape, kernel=_split, decode=decode_split,
    encode=encode_split, num_outputs=lambda attrs: len(attrs["split"]), doc="split along axis into sizes",
    z3_symbol="split", facts=split_facts, menu=Menu(({"axis": 0}, {"axis": 1}), resolve=_menu_halves),
    family="layout", fit=split_fit, terms=_split_terms)

RESHAPE = OpDef(
    name="reshape", onnx_types=("Reshape",), min_inputs=1, max_inputs=1,
    attrs=(AttrSpec("shape", z3="code", symbolic=True),),
    shape=reshape_shape, kernel=lambda xp, a, attrs: [xp.reshape(a[0], attrs["shape"])],
    decode=decode_reshape, encode=encode_reshape, doc="reshape to a shape (symbolic dims computed at run time)",
    z3_symbol="reshape", family="layout")

OPS = (CONCAT, SPLIT, RESHAPE)

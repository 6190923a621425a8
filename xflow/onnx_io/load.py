"""Load an ONNX model into the IR: op-table ops are decoded, everything else stays opaque."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import sympy
from onnx import numpy_helper

from xflow.errors import XflowError, one_line
from xflow.ir import FLOAT_DTYPES, OPAQUE, Attrs, Constant, Graph, ModelContext, Node, Origin, TensorType
from xflow.ir.dims import Dim, concrete, dims_of, equal, free_symbols, is_static, parse_dim, symbol, symbol_sources
from xflow.onnx_io.constant_nodes import node_constants
from xflow.onnx_io.dim_relations import DimRelations, find_relations, solve_sizes
from xflow.onnx_io.known_values import MAX_FOLDED_ELEMENTS, known_values
from xflow.onnx_io.observe import observed_types
from xflow.onnx_io.shell import INLINE_ELEMENTS, copy_fields, elements, weights_as_inputs
from xflow.ops import DECODERS, DEFAULT_DOMAINS, OPS, ShapeError, decoder_for

ALGEBRA_DTYPES = FLOAT_DTYPES | {onnx.TensorProto.BOOL}


def read_model(path: str, full_check: bool = True) -> onnx.ModelProto:
    """Parse and check an ONNX file (external data is left on disk); XflowError on any problem. ``full_check``
    False skips ONNX's checker (seconds on a large model) for a model that is then compared with a checked one."""
    if not os.path.exists(path):
        raise XflowError(path, "no such file")
    if os.path.isdir(path):
        raise XflowError(path, "is a directory, not an ONNX file")
    if os.path.getsize(path) == 0:
        raise XflowError(path, "empty file, not an ONNX model")
    try:
        model = onnx.load(path, load_external_data=False)
    except OSError as exc:
        raise XflowError(path, f"cannot read: {exc.strerror or exc}") from None
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, JSON's ParseError (for a .json name), ...
        raise XflowError(path, f"not an ONNX model (protobuf parse failed: {one_line(exc)})") from None
    if full_check:
        check_proto(model, path, checked=path)
    elif model.ir_version <= 0 or not model.opset_import or not model.HasField("graph"):
        raise XflowError(path, "not an ONNX model (no IR version, opset imports or graph)")
    check_external_data(model, os.path.dirname(os.path.abspath(path)))
    return model


def check_external_data(model: onnx.ModelProto, base_dir: str) -> None:
    """XflowError naming the data file when an initializer's external data is missing, not a regular file, or
    shorter than the model says (its offset and length, or its dims and dtype): found when the model is read,
    not as ONNX Runtime's failure in the middle of a run."""
    sizes: dict[str, int] = {}
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        path = os.path.join(base_dir, info.get("location", ""))
        if path not in sizes:
            if not os.path.isfile(path):
                raise XflowError(path, f"external data of initializer {tensor.name!r}: no such file")
            sizes[path] = os.path.getsize(path)
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else _data_bytes(tensor)
        except ValueError:
            raise XflowError(path, f"initializer {tensor.name!r}: offset or length is not an integer") from None
        if length is not None and offset + length > sizes[path]:
            raise XflowError(path, f"external data file is shorter than the model says: initializer {tensor.name!r} "
                                   f"needs bytes {offset}..{offset + length}, the file has {sizes[path]}")


def _data_bytes(tensor: onnx.TensorProto) -> int | None:
    """The bytes a tensor's raw data takes (None for types without a fixed size: strings)."""
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return None
    if tensor.data_type == onnx.TensorProto.STRING:
        return None
    count = 1
    for d in tensor.dims:
        count *= int(d)
    packed = {getattr(onnx.TensorProto, n, -1) for n in ("INT4", "UINT4", "FLOAT4E2M1")}  # two to a byte
    return (count + 1) // 2 if tensor.data_type in packed else count * itemsize


def model_from_bytes(data: bytes | bytearray | memoryview, label: str = "<bytes>") -> onnx.ModelProto:
    """Parse and check a serialized ONNX model given in memory; XflowError naming ``label`` (not the bytes)."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(bytes(data))
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and its relatives
        raise XflowError(label, f"not an ONNX model (protobuf parse failed: {one_line(exc)})") from None
    check_proto(model, label)
    return model


#: Operators of the op table that ONNX Runtime registers in the standard domain and ONNX does not define
#: (SimplifiedLayerNormalization): the checker has no schema for them, so it checks them as a domain of their own
_RUNTIME_STANDARD_OPS = frozenset(t for op in OPS.values() if op.domain == "" for t in op.onnx_types
                                  if not onnx.defs.has(t))
_RUNTIME_STANDARD_DOMAIN = "xflow.onnxruntime-standard"


def _checkable(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of ``model`` the checker accepts when its graph holds ONNX Runtime's standard-domain extensions
    (each moved to a domain of its own, which the checker does not know and so does not check), else None."""
    if not any(n.op_type in _RUNTIME_STANDARD_OPS and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for n in copy.graph.node:
        if n.op_type in _RUNTIME_STANDARD_OPS and n.domain in ("", "ai.onnx"):
            n.domain = _RUNTIME_STANDARD_DOMAIN
    copy.opset_import.append(onnx.helper.make_opsetid(_RUNTIME_STANDARD_DOMAIN, 1))
    return copy


def check_proto(model: onnx.ModelProto, label: str, checked: str | onnx.ModelProto | None = None) -> None:
    """XflowError naming ``label`` when ``model`` is not a valid ONNX model (the checker runs on ``checked``:
    the file, so that external data and large models are checked where they are, or the model; on a copy when
    the graph holds operators ONNX Runtime adds to the standard domain)."""
    if model.ir_version <= 0 or not model.opset_import or not model.HasField("graph"):
        raise XflowError(label, "not an ONNX model (no IR version, opset imports or graph)")
    checkable = _checkable(model)
    try:
        onnx.checker.check_model(checkable if checkable is not None else checked if checked is not None else model)
    except Exception as exc:  # the checker raises several unrelated types
        raise XflowError(label, f"invalid ONNX model: {one_line(exc)}") from None


def parse_input_shapes(specs: list[str] | tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """Parse ``name=1x3x224x224`` options into a dict."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.split("x")) if dims else ()
            if any(d < 0 for d in shapes[name]):
                raise ValueError
        except ValueError:
            raise XflowError(None, f"--input-shape {spec!r}: expected NAME=D1xD2x... with non-negative ints") \
                from None
    return shapes


def _type_from_value_info(vi: onnx.ValueInfoProto) -> TensorType | None:
    if not vi.type.HasField("tensor_type"):
        return None
    return TensorType(vi.type.tensor_type.elem_type, dims_of(vi))  # dynamic dims as symbols (xflow.ir.dims)


def check_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], path: str) -> None:
    """XflowError naming ``path`` when ``--input-shape`` names no input, or gives one another rank or another
    size where a dim is fixed; ``model`` is not modified."""
    scratch = onnx.ModelProto()
    scratch.graph.input.extend(model.graph.input)
    _fix_input_shapes(scratch, shapes, path)


def _fix_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], path: str) -> None:
    inputs = {vi.name: vi for vi in model.graph.input}
    for name, dims in shapes.items():
        if name not in inputs:
            raise XflowError(path, f"--input-shape names {name!r}, which is not an input (inputs: {sorted(inputs)})")
        if not inputs[name].type.HasField("tensor_type"):
            raise XflowError(path, f"--input-shape {name}: the input is not a tensor")
        tensor_type = inputs[name].type.tensor_type
        if not tensor_type.HasField("shape"):  # rank unknown: the option gives it
            tensor_type.shape.SetInParent()
            for _ in dims:
                tensor_type.shape.dim.add()
        shape = tensor_type.shape
        if len(shape.dim) != len(dims):
            raise XflowError(path, f"--input-shape {name}: rank {len(dims)} but the input has rank {len(shape.dim)}")
        for d, value in zip(shape.dim, dims, strict=True):
            if d.HasField("dim_value") and d.dim_value != value:
                raise XflowError(path, f"--input-shape {name}: dim {d.dim_value} is fixed in the model, not {value}")
            d.Clear()
            d.dim_value = value


def symbolic_types(model: onnx.ModelProto, plain: Mapping[str, TensorType] | None = None
                   ) -> dict[str, TensorType]:
    """Value types from ONNX Runtime's symbolic shape inference, which follows Shape -> Gather -> Concat ->
    Reshape chains and writes derived dims as expressions (``2*batch*seq``): those of the values it could
    infer, {} when it fails.

    Without merging, its inference stops at the first op that needs two symbols equal (a transformers
    export's embeddings: ``batch`` against the batch of an Expand it cannot follow), and nothing after it is
    known. With ``auto_merge`` it assumes such symbols equal, which may be wrong (a dim that is 1 at run time
    merged with ``batch``): those types are kept only where two runs of the model, at two sets of sizes where
    the inputs' symbols differ from each other and from 1, give exactly the dims they say, and where the symbols
    the graph relates (``dim_relations``: a KV cache's ``total_seq = past_seq + seq``) keep their relation, so
    that the runs can be made at all (``plain``: the types without merging, when already inferred)."""
    plain = _symbolic_inference(model, auto_merge=False) if plain is None else dict(plain)
    named = {s for vi in model.graph.input for s in free_symbols(dims_of(vi) or ())}
    if all(set(free_symbols(t.shape)) <= named for t in plain.values()) and \
            len(plain) >= sum(1 for n in model.graph.node for o in n.output if o):
        return plain  # complete without assuming anything
    merged = _symbolic_inference(model, auto_merge=True)
    derived = solve_sizes(find_relations(model, plain).relations, (), sorted(named))
    checked = _checked_by_runs(model, merged, sorted(named), derived)
    return {**checked, **{k: t for k, t in plain.items() if k not in checked}}


def plain_symbolic_types(model: onnx.ModelProto) -> dict[str, TensorType]:
    """The types ONNX Runtime's symbolic shape inference gives without assuming any two dims equal (where it
    stops is where a model's dims must meet: ``dim_relations``); {} when it fails."""
    return _symbolic_inference(model, auto_merge=False)


#: the sizes of the inputs' symbols (in name order) at the two runs that check merged types: distinct, > 1
_CHECK_SIZES = ((2, 3, 5, 7, 11, 13), (3, 5, 7, 11, 13, 17))


def _checked_by_runs(model: onnx.ModelProto, types: dict[str, TensorType], symbols: list[str],
                     derived: Mapping[str, Dim] | None = None) -> dict[str, TensorType]:
    """The types whose dims, over ``symbols`` only, are what two runs of the model give (``observed_types``,
    with each symbol at its ``_CHECK_SIZES``, those ``derived`` from the others at what that makes them); {}
    when a run cannot be made."""
    derived = derived or {}
    free = [s for s in symbols if s not in derived]
    if not symbols or len(free) > len(_CHECK_SIZES[0]):
        return {}
    kept = {name: t for name, t in types.items() if set(free_symbols(t.shape)) <= set(symbols)}
    initializers = {t.name for t in model.graph.initializer}
    for sizes in _CHECK_SIZES:
        point = dict(zip(free, sizes, strict=False))
        point.update({name: concrete(expr, point) for name, expr in derived.items()})
        inputs: dict[str, TensorType] = {}
        for vi in model.graph.input:
            dims = dims_of(vi)
            if vi.name in initializers or dims is None:
                continue
            try:
                inputs[vi.name] = TensorType(vi.type.tensor_type.elem_type, tuple(concrete(d, point) for d in dims))
            except KeyError:
                return {}  # an unnamed dim: no size to run it at
        observed = observed_types(model, inputs)
        if not observed:
            return {}
        kept = {name: t for name, t in kept.items() if name in observed and _dims_at(t, point) == observed[name].shape}
    return kept


def _dims_at(t: TensorType, point: Mapping[str, int]) -> tuple[int, ...] | None:
    try:
        return tuple(concrete(d, point) for d in t.shape)  # type: ignore[union-attr]
    except (KeyError, TypeError, ValueError):
        return None


def _symbolic_inference(model: onnx.ModelProto, auto_merge: bool) -> dict[str, TensorType]:
    """The types ORT's symbolic shape inference gives (see ``symbolic_types``); {} when it fails."""
    inference = _run_symbolic_inference(model, auto_merge)
    return {} if inference is None or inference.out_mp_ is None else _value_types(inference.out_mp_)


def symbolic_merges(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """The dims ORT's symbolic shape inference with ``auto_merge`` assumed equal to go on, as pairs of dim texts
    (``("past_seq + seq", "total_seq")``; a made-up symbol where it named a node's output dim itself); [] when it
    fails."""
    inference = _run_symbolic_inference(model, auto_merge=True)
    if inference is None:
        return []
    return [(str(inference.symbolic_dims_.get(k, k)), str(inference.symbolic_dims_.get(v, v)))
            for k, v in inference.suggested_merge_.items()]


def _run_symbolic_inference(model: onnx.ModelProto, auto_merge: bool) -> Any:
    """ORT's SymbolicShapeInference, run over ``model`` as far as it goes; None when it fails."""
    try:
        from onnxruntime.tools import symbolic_shape_infer

        quiet = logging.getLogger(symbolic_shape_infer.__name__)  # its logger would print to stderr
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            # Driven step by step as its own infer_shapes does, which on a model it cannot complete saves
            # the partial result as sym_shape_infer_temp.onnx in the working directory (and raises): the
            # partial result is what is wanted here, and nothing may be written.
            inference = symbolic_shape_infer.SymbolicShapeInference(2**31 - 1, auto_merge, False, 0)
            inference._preprocess(_inference_model(model))
            _input_expressions(inference)
            while inference.run_:
                inference._infer_impl()
            inference._update_output_from_vi()
        finally:
            quiet.setLevel(level)
    except Exception:  # noqa: BLE001 - best effort, as ONNX's own inference: unknown dims stay unknown
        return None
    return inference


def _input_expressions(inference: Any) -> None:
    """Make ORT's inference read a graph input's dim written as an expression (``past_seq + seq``: a model
    stated over its free symbols, ``graph_from_model``) as that expression, not as one symbol of that name.

    It makes a symbol of every input dim's text on each pass, except where it has been told to merge that text
    with another: a text merged with itself, whose value is the expression, is read as the expression, so that
    a Concat's ``past_seq + seq`` and the mask's dim are one dim to it (its dim texts are ``str`` of its
    expressions, which the input's text is made to match)."""
    for vi in inference.out_mp_.graph.input:
        if not vi.type.HasField("tensor_type"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            expr = parse_dim(d.dim_param) if d.dim_param else None
            if expr is None or is_static(expr) or isinstance(expr, sympy.Symbol):
                continue
            d.dim_param = str(expr)
            inference.symbolic_dims_[d.dim_param] = expr
            inference.suggested_merge_[d.dim_param] = d.dim_param


def _value_types(inferred: onnx.ModelProto) -> dict[str, TensorType]:
    """The types an inferred model states for its values and outputs (where it knows the rank)."""
    found: dict[str, TensorType] = {}
    for vi in itertools.chain(inferred.graph.value_info, inferred.graph.output):
        t = _type_from_value_info(vi)
        if t is not None and t.shape is not None:
            found[vi.name] = t
    return found


def _says_more(new: TensorType, old: TensorType | None, named: set[str]) -> bool:
    """True when ``new`` says more than ``old``: a rank where it had none, a static dim where it had a symbol,
    or dims over the inputs' symbols (``named``) where it had fresh ones."""
    if old is None or old.shape is None:
        return True
    if new.dtype != old.dtype or len(new.shape) != len(old.shape):
        return False
    if any(is_static(a) and not is_static(b) for a, b in zip(new.shape, old.shape, strict=True)):
        return True
    return set(free_symbols(new.shape)) <= named and not set(free_symbols(old.shape)) <= named


def _subgraph_captures(node: onnx.NodeProto) -> tuple[str, ...]:
    """Outer-scope names that the node's subgraphs read."""
    captured: list[str] = []

    def visit(graph: onnx.GraphProto, bound: set[str]) -> None:
        local = bound | {i.name for i in graph.input} | {t.name for t in graph.initializer}
        local |= {t.values.name for t in graph.sparse_initializer}
        for n in graph.node:
            for name in n.input:
                if name and name not in local and name not in captured:
                    captured.append(name)
            for attr in n.attribute:
                for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    visit(sub, local)
            local |= set(n.output)

    for attr in node.attribute:
        for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            visit(sub, set())
    return tuple(captured)


class _Decoder:
    """The DecodeContext the op table's decoders see while a graph is loaded."""

    def __init__(self, model: onnx.ModelProto, types: dict[str, TensorType], constants: dict[str, Constant],
                 const_nodes: dict[str, onnx.TensorProto], opset: int, base_dir: str,
                 folded: Mapping[str, np.ndarray] | None = None) -> None:
        self.opset = opset
        self.folded = folded or {}
        self.types = types
        self.constants = constants
        self.const_nodes = const_nodes
        self.base_dir = base_dir
        # the symbols a run reads from a graph input's dim: a dim over any other (a size only a run can tell,
        # named by inference) has no value at the profile's points, so a node with one could not be costed, and
        # a reshape target over it could not be written: it stays opaque
        self.symbols = set(symbol_sources((vi.name, dims_of(vi)) for vi in model.graph.input
                                          if vi.name not in constants))
        self.taken = {vi.name for vi in model.graph.input} | set(types) | set(constants)
        for n in model.graph.node:
            self.taken.update(n.output)
        self.counter = itertools.count()
        self.added: list[str] = []

    def type_of(self, name: str) -> TensorType | None:
        return self.types.get(name)

    def constant_value(self, name: str) -> np.ndarray | None:
        if name in self.constants:
            c = self.constants[name]
            return c.value() if c.nbytes <= 1 << 20 else None
        if name in self.const_nodes:
            return numpy_helper.to_array(self.const_nodes[name])
        return self.folded.get(name)

    def constant_array(self, name: str) -> np.ndarray | None:
        """An initializer's value whatever its size (a weight a decoder lays out anew), else None."""
        return self.constants[name].value() if name in self.constants else None

    def fresh_name(self, hint: str) -> str:
        while True:
            name = f"{hint}__xf{next(self.counter)}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def add_constant(self, array: np.ndarray, hint: str) -> str:
        name = self.fresh_name(hint)
        self.constants[name] = Constant.from_array(array)
        self.types[name] = self.constants[name].type
        self.added.append(name)
        return name


def _decode_node(proto: onnx.NodeProto, ctx: _Decoder) -> list[Node] | None:
    """Decode one ONNX node into op-table nodes, or None when it must stay opaque."""
    decode = decoder_for(proto.domain, proto.op_type)
    if decode is None or not proto.input:
        return None
    for name in (n for n in proto.input if n):  # every dim known: an int, or an expression over the inputs' symbols
        if not _runtime_dims(ctx.types.get(name), ctx.symbols):
            return None
    # an output's dims may be unknown to inference (a fresh symbol, as after a Reshape to -1 of a dynamic
    # input): the op table's shape rule then gives them, over the inputs' symbols
    for name in (n for n in proto.output if n):
        t = ctx.types.get(name)
        if t is None or t.shape is None:
            return None
    # the algebra computes on float tensors (and the bool masks comparisons make for Where); integer
    # computations (shapes, indices) stay opaque unless they fold to constants first
    if any(ctx.types[name].dtype not in ALGEBRA_DTYPES for name in proto.output if name):
        return None
    mark = len(ctx.added)
    try:
        nodes = decode(proto, ctx)
        if not nodes:  # the decoder declined (after perhaps adding constants: they are dropped below)
            raise ShapeError(f"{proto.op_type} stays opaque")
        produced: dict[str, TensorType] = {}
        for n in nodes:
            entry = OPS[n.op]
            shapes = [(produced.get(i) or ctx.types[i]).shape for i in n.inputs if i]
            out_shapes = entry.infer(shapes, n.attrs)
            in_dtypes = [(produced.get(i) or ctx.types[i]).dtype for i in n.inputs if i]
            dtype = entry.output_dtype(in_dtypes, n.attrs) if in_dtypes else proto_dtype(proto, ctx)
            for name, shape in zip(n.outputs, out_shapes, strict=True):
                produced[name] = TensorType(dtype, shape)
        for name in proto.output:
            if not name:
                continue
            declared, found = ctx.types[name], produced.get(name)
            if _runtime_dims(declared, ctx.symbols):
                if not declared.same_as(found):
                    raise ShapeError(f"decoded type {found} differs from ONNX's {declared}")
            elif not (_runtime_dims(found, ctx.symbols) and _compatible(declared, found, ctx.symbols)):
                raise ShapeError(f"decoded type {found} does not refine ONNX's {declared}")
    except (ShapeError, KeyError, ValueError, IndexError, TypeError):  # TypeError: a dim a decoder needs as a number
        for name in ctx.added[mark:]:
            ctx.types.pop(name, None)
            ctx.constants.pop(name, None)
        del ctx.added[mark:]
        return None
    ctx.types.update(produced)
    if all(n.origin is None for n in nodes):  # one origin for the group: saved as the original node
        origin = Origin(proto, len(nodes))
        nodes = [Node(n.op, n.inputs, n.outputs, n.attrs, n.name, origin) for n in nodes]
    return nodes


def _runtime_dims(t: TensorType | None, symbols: set[str]) -> bool:
    """True when every dim of ``t`` is known: an int, or an expression over symbols a run can read."""
    if t is None or t.shape is None or any(d is None for d in t.shape):
        return False
    return t.is_static or set(free_symbols(t.shape)) <= symbols


def _compatible(declared: TensorType, found: TensorType | None, symbols: set[str]) -> bool:
    """True when ``found`` refines an inferred type with unknown dims: the same element type and rank, and
    the same dim wherever the inferred one is known."""
    if found is None or found.shape is None or declared.shape is None or found.dtype != declared.dtype \
            or len(found.shape) != len(declared.shape):
        return False
    for d, f in zip(declared.shape, found.shape, strict=True):
        if d is None or not (is_static(d) or set(free_symbols((d,))) <= symbols):
            continue
        if not equal(d, f):
            return False
    return True


def proto_dtype(proto: onnx.NodeProto, ctx: _Decoder) -> int:
    """The element type of the node's first output."""
    return ctx.types[proto.output[0]].dtype


def graph_from_model(model: onnx.ModelProto, base_dir: str = "", path: str = "",
                     input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                     relations: DimRelations | None = None) -> Graph:
    """Build the IR from a parsed model (shapes inferred; op-table ops decoded, with the values of constant
    nodes and of shape computations on the model's fixed dims known to the decoders; others opaque).

    ``input_shapes`` are measuring shapes: the graph's value types are those the model has at them. The dims
    the graph relates (``relations``, found here when not given: ``model_relations``) are stated over the free
    symbols: ``total_seq`` as ``past_seq + seq`` in every value's type, graph inputs and outputs included, so
    that shape rules and rule conditions see one dim where the graph has one. Either way the graph's context
    keeps the model's own inputs and outputs, so a written graph declares the original interface
    (``dim_param``s included). ``model`` is not modified; the graph's constants refer to its initializers, so
    it must not be modified while the graph is used. ``base_dir`` is where relative external-data locations
    are resolved (the model file's folder)."""
    if relations is None and not input_shapes and len(_input_symbols(model)) > 1:
        relations = model_relations(model)
    derived = solve_sizes(relations.relations, (), _input_symbols(model)) if relations is not None else {}
    if not input_shapes and not derived:  # the model as it is: the relations' inference is the loader's too
        return _build_graph(model, base_dir, path, plain=relations.inferred if relations is not None else None)
    interface = [model.graph.input, model.graph.output, model.graph.value_info]
    saved = [[_copy(vi) for vi in infos] for infos in interface]
    try:
        _fix_input_shapes(model, input_shapes or {}, path)
        _state_over_free_symbols(model, derived)
        graph = _build_graph(model, base_dir, path, fold_shapes=not input_shapes)  # measuring dims never fold
    finally:
        for infos, copies in zip(interface, saved, strict=True):
            del infos[:]
            infos.extend(copies)
    assert graph.context is not None
    context = dataclasses.replace(graph.context, template=_without_nodes(model))
    return Graph(graph.nodes, graph.inputs, graph.outputs, graph.types, graph.constants, context)


def model_relations(model: onnx.ModelProto) -> DimRelations:
    """The relations ``model``'s graph states between its input dims (``dim_relations``), from ONNX Runtime's
    symbolic shape inference (kept in them: the loader's own pass reuses it); where it finds a cache but nothing
    its length meets, also from the dims that inference merges (a second, merging run: only then, as most
    models have no cache)."""
    inferred = plain_symbolic_types(model)
    found = find_relations(model, inferred)
    cached = {c.past for c in found.caches}
    if cached and not any(cached & {r.symbol, *(s.name for s in r.expr.free_symbols)} for r in found.relations):
        found = find_relations(model, inferred, symbolic_merges(model))
    return found


def _input_symbols(model: onnx.ModelProto) -> list[str]:
    """The symbols of the graph inputs' dims (initializers aside), in input order."""
    initializers = {t.name for t in model.graph.initializer}
    order: list[str] = []
    for vi in model.graph.input:
        if vi.name not in initializers:
            order += [s for s in free_symbols(dims_of(vi) or ()) if s not in order]
    return order


def _copy(vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(vi)
    return copy


def _state_over_free_symbols(model: onnx.ModelProto, derived: Mapping[str, sympy.Expr]) -> None:
    """Write each dim over a ``derived`` symbol (graph inputs, outputs, value infos) with the symbol replaced by
    its expression over the free ones (``total_seq`` -> ``past_seq + seq``), where those are still input dims
    (``--input-shape`` may have fixed them)."""
    named = set(_input_symbols(model))
    usable = {symbol(name): expr for name, expr in derived.items()
              if {s.name for s in expr.free_symbols} <= named - set(derived)}
    if not usable:
        return
    for vi in itertools.chain(model.graph.input, model.graph.output, model.graph.value_info):
        if not vi.type.HasField("tensor_type"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            expr = parse_dim(d.dim_param) if d.dim_param else None
            if expr is None or is_static(expr) or not (expr.free_symbols & set(usable)):
                continue
            stated = sympy.expand(expr.subs(usable))
            d.Clear()
            if is_static(stated):
                d.dim_value = int(stated)
            else:
                d.dim_param = str(stated)


def _build_graph(model: onnx.ModelProto, base_dir: str, path: str, fold_shapes: bool = True,
                 plain: Mapping[str, TensorType] | None = None) -> Graph:
    inference = _inference_model(model)  # also what the rounds on static dims below infer from
    try:
        inferred = onnx.shape_inference.infer_shapes(inference, strict_mode=False,
                                                     data_prop=True)
    except Exception:  # shape inference is best effort: unknown shapes just keep nodes opaque
        inferred = model
    g = inferred.graph
    types: dict[str, TensorType] = {}
    for vi in itertools.chain(g.input, g.value_info, g.output):
        t = _type_from_value_info(vi)
        if t is not None:
            types[vi.name] = t
    constants: dict[str, Constant] = {}
    for tensor in model.graph.initializer:
        constants[tensor.name] = Constant.from_proto(tensor, base_dir)
        types[tensor.name] = constants[tensor.name].type
    # an initializer listed among the inputs is a default a caller may override: no rewrite folds or merges it
    overridable = frozenset(constants) & {vi.name for vi in model.graph.input}
    # a Constant node's value is a constant as an initializer's is (the writer puts the node back)
    from_nodes = node_constants(model.graph, constants, base_dir)
    for name, const in from_nodes.items():
        constants[name] = const
        types[name] = const.type
    unknown = {name for n in model.graph.node for name in n.output
               if name and not (name in types and types[name].is_static)}
    if unknown:  # symbolic dims left by inference: a run of the static-shape model gives the exact ones
        types.update((name, t) for name, t in observed_types(model, types).items() if name in unknown)
        unknown = {name for name in unknown if not (name in types and types[name].is_static)}
    named_symbols = {s for vi in model.graph.input for s in free_symbols(dims_of(vi) or ())}
    if unknown:  # still dynamic: derived dims (batch*seq, seq+1) from ORT's symbolic inference
        types.update((name, t) for name, t in symbolic_types(model, plain).items()
                     if name in unknown and _says_more(t, types.get(name), named_symbols))
    known = {name: c.value() for name, c in constants.items()
             if not c.is_external and c.type.shape is not None and c.type.size <= MAX_FOLDED_ELEMENTS}
    captured = {name for n in model.graph.node for name in _subgraph_captures(n)}
    readers = {op_type for domain, op_type in DECODERS if not domain}
    folded = known_values(model, types, known, fold_shapes, readers, captured)
    if fold_shapes and named_symbols:
        # With dynamic inputs, the static dims of a shape fold (known_values) and what they parameterize (a
        # Pad's pads, a Reshape's target) then gives its output static dims, whose shapes fold in turn: to a
        # fixed point, each round one more shape inference with the values known so far.
        # ONNX Runtime's symbolic inference (without merging symbols) then follows the -1s and computed targets
        # beside the dynamic dims (Swin's ``64*batch`` windows) that ONNX's inference leaves unknown.
        def refinements(inferred: dict[str, TensorType]) -> dict[str, TensorType]:
            return {name: t for name, t in inferred.items() if name not in folded and
                    set(free_symbols(t.shape)) <= named_symbols and _says_more(t, types.get(name), named_symbols)}

        for _ in range(MAX_INFERENCE_ROUNDS):
            given = _with_values(inference, folded)
            refined = refinements(_onnx_types(given)) or refinements(_symbolic_inference(given, auto_merge=False))
            if not refined:
                break
            types.update(refined)
            folded = known_values(model, types, known, fold_shapes, readers, captured)
    for name, value in folded.items():  # the nodes stay (load/save is lossless); decoders read their values
        if name not in types or not types[name].is_static:
            types[name] = Constant.from_array(value).type
    const_nodes = {n.output[0]: n.attribute[0].t for n in model.graph.node
                   if n.op_type == "Constant" and n.domain in DEFAULT_DOMAINS and len(n.attribute) == 1
                   and n.attribute[0].name == "value" and len(n.output) == 1}
    ctx = _Decoder(model, types, constants, const_nodes, _default_opset(model), base_dir, folded)
    nodes: list[Node] = []
    for k, proto in enumerate(model.graph.node):
        if proto.output and proto.output[0] in from_nodes and from_nodes[proto.output[0]].index == k:
            continue
        decoded = _decode_node(proto, ctx)
        if decoded is None:
            decoded = [Node(OPAQUE, tuple(proto.input), tuple(proto.output), Attrs(), proto.name,
                            Origin(proto, 1), _subgraph_captures(proto))]
        nodes.extend(decoded)
    template = _without_nodes(model)
    inputs = tuple(vi.name for vi in model.graph.input if vi.name not in constants)
    outputs = tuple(vi.name for vi in model.graph.output)
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    context = ModelContext(template, base_dir, path, external, overridable)
    return Graph(tuple(nodes), inputs, outputs, types, constants, context)


def _inference_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model as shape inference sees it: large inline initializers become typed graph inputs.

    ``infer_shapes`` serializes the whole model; without this, every weight would be copied (twice
    the memory) and models near protobuf's 2 GB limit would fail inference. Only small tensors (shape
    targets, axes, ...) matter for data propagation, so those are kept with their values."""
    big = {t.name for t in model.graph.initializer
           if t.data_location != onnx.TensorProto.EXTERNAL and elements(t) > INLINE_ELEMENTS}
    return weights_as_inputs(model, big) if big else model


#: Most rounds of shape inference with folded values (each one lets the next shapes fold)
MAX_INFERENCE_ROUNDS = 16


def _with_values(base: onnx.ModelProto, folded: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """The model as shape inference sees it (``base``: ``_inference_model``'s) with the folded values as
    initializers and the nodes that compute them left out: in a model with dynamic inputs, a Pad's pads or a
    Reshape's target that folded from static dims (``known_values``) gives inference its output dims this way."""
    given = onnx.ModelProto()
    copy_fields(base, given, skip=("graph",))
    copy_fields(base.graph, given.graph, skip=("node", "initializer"))
    given.graph.initializer.extend(t for t in base.graph.initializer if t.name not in folded)
    given.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), name) for name, v in folded.items())
    given.graph.node.extend(n for n in base.graph.node if not (n.output and all(o in folded for o in n.output if o)))
    return given


def _onnx_types(model: onnx.ModelProto) -> dict[str, TensorType]:
    """Value types from ONNX's shape inference with data propagation; {} when it fails."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - best effort: unknown shapes just keep nodes opaque
        return {}
    return _value_types(inferred)


def _without_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model without graph nodes and initializers (so weights are not copied)."""
    shell = onnx.ModelProto()
    copy_fields(model, shell, skip=("graph",))
    copy_fields(model.graph, shell.graph, skip=("node", "initializer"))
    return shell


def _default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            return int(imp.version)
    return 1


def load(path: str, input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> Graph:
    """Read an ONNX file into the IR; external data stays on disk until needed."""
    model = read_model(path)
    return graph_from_model(model, os.path.dirname(os.path.abspath(path)), path, input_shapes)

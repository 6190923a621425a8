"""Write the IR back to ONNX: unchanged nodes as their original protos, new ones via the op table."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import secrets
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from xflow.errors import XflowError
from xflow.ir import Constant, Graph, Node, TensorType
from xflow.ir.dims import SymbolSource, symbol_sources
from xflow.onnx_io.constant_nodes import NodeConstant, with_constant_nodes, written_as_nodes
from xflow.ops import DEFAULT_DOMAINS, DOMAIN_VERSIONS, OPS

EXTERNAL_THRESHOLD = 1 << 30  # bytes of inline weights above which we write external data anyway
MIN_EXTERNAL_TENSOR = 1024  # tensors smaller than this stay inline even in external-data models
COPY_BUFFER = 8 << 20  # bytes: external data is copied through one buffer of this size

# An initializer written straight from its source into the data file (its proto in the written model
# carries name, type and dims; its bytes go to the data file): a new array, or an inline tensor of the
# source model. So the weights are never copied into a second, serialized form in memory.
Deferred = dict[str, "np.ndarray | onnx.TensorProto"]


class _Encoder:
    """The EncodeContext the op table's encoders see while a graph is written."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.opset = graph.context.opset if graph.context else 17
        self.taken = set(graph.types) | set(graph.constants) | set(graph.producers) | set(graph.inputs)
        self.taken.update(name for n in graph.nodes for name in (*n.inputs, *n.implicit))
        self.counter = itertools.count()
        self.new_constants: dict[str, np.ndarray] = {}
        # shape inputs computed at run time, shared by the nodes written after the first (``runtime_shape``)
        self.computed_values: dict[tuple[str, Any], str] = {}

    def fresh_name(self, hint: str) -> str:
        while True:
            name = f"{hint}__xf{next(self.counter)}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def add_constant(self, array: np.ndarray, hint: str) -> str:
        name = self.fresh_name(hint)
        self.new_constants[name] = array
        return name

    def type_of(self, name: str) -> TensorType | None:
        """The type of a value of the graph (encoders whose ONNX form ties a constant's type to it ask)."""
        return self.graph.types.get(name)

    @functools.cached_property
    def symbol_sources(self) -> dict[str, SymbolSource]:
        """Where a run of the written model reads each symbol: a dim of one of the graph's inputs (the model's
        interface, whose dims load took from it; or a placement segment's inputs)."""
        types = self.graph.types
        return symbol_sources((i, types[i].shape) for i in self.graph.inputs if i in types)

    def symbol_source(self, name: str) -> SymbolSource | None:
        """Where a run of the written model reads symbol ``name`` (``symbol_sources``)."""
        return self.symbol_sources.get(name)


def _opaque_proto(node: Node) -> onnx.NodeProto:
    proto = node.origin.proto  # type: ignore[union-attr]
    if tuple(proto.input) == node.inputs and tuple(proto.output) == node.outputs:
        return proto
    copy = onnx.NodeProto()
    copy.CopyFrom(proto)
    del copy.input[:]
    copy.input.extend(node.inputs)
    del copy.output[:]
    copy.output.extend(node.outputs)
    return copy


def _reusable_origins(graph: Graph) -> set[int]:
    """ids of the origins whose original ONNX node can be written in place of their IR nodes: every
    member is still in the graph, every value the original node reads still exists, no value internal to the
    group is read outside it, and nothing reads the group's outputs before its last member (where the original
    node is written)."""
    members: dict[int, list[Node]] = {}
    for node in graph.nodes:
        if not node.is_opaque and node.origin is not None:
            members.setdefault(id(node.origin), []).append(node)
    reusable: set[int] = set()
    available: set[str] | None = None
    for key, group in members.items():
        origin = group[0].origin
        assert origin is not None
        if len(group) != origin.size:
            continue
        if available is None:
            available = {*graph.inputs, *graph.constants, *graph.producers}
        if any(name and name not in available for name in origin.proto.input):
            continue  # it read a value a rewrite took away (a Reshape's computed target): encoded anew
        if len(group) > 1:
            produced = {o for n in group for o in n.outputs if o}
            proto_outputs = {o for o in origin.proto.output if o}
            if not proto_outputs <= produced:
                continue
            member_ids = {id(n) for n in group}
            last = max(graph.position[n] for n in group)
            if any(name in graph.output_set for name in produced - proto_outputs):
                continue
            if any(id(user) not in member_ids and (name not in proto_outputs or graph.position[user] < last)
                   for name in produced for user, _ in graph.users.get(name, ())):
                continue
        reusable.add(key)
    return reusable


def encode_nodes(graph: Graph, reuse_protos: bool = True) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    """ONNX nodes for the graph, in order, and the new constants the encoders asked for.

    With ``reuse_protos`` an op-table node whose whole origin survives is written as the original
    ONNX node (exact round trip); otherwise every op-table node is re-encoded from the IR."""
    ctx = _Encoder(graph)
    reusable = _reusable_origins(graph) if reuse_protos else set()
    remaining = {key: node.origin.size for node in graph.nodes  # type: ignore[union-attr]
                 if (key := id(node.origin)) in reusable}
    # Node names written as they were (original protos) are never changed; a re-encoded node whose
    # name is already taken (several IR nodes decoded from one ONNX node share its name, and rewrites
    # copy names) gets a fresh one: ONNX Runtime rejects models with two nodes of the same name.
    names = {n.origin.proto.name for n in graph.nodes  # type: ignore[union-attr]
             if n.origin is not None and (n.is_opaque or id(n.origin) in reusable)}
    names.discard("")
    protos: list[onnx.NodeProto] = []
    for node in graph.nodes:
        if node.is_opaque:
            protos.append(_opaque_proto(node))
            continue
        key = id(node.origin)
        if key in reusable:
            remaining[key] -= 1
            if remaining[key] == 0:  # the last member: all inputs of the group exist by now
                protos.append(node.origin.proto)  # type: ignore[union-attr]
            continue
        for proto in OPS[node.op].encode(node, ctx):
            if proto.name in names:
                proto.name = _fresh_node_name(proto.name, names)
            if proto.name:
                names.add(proto.name)
            protos.append(proto)
    return protos, ctx.new_constants


def _fresh_node_name(name: str, taken: set[str]) -> str:
    for k in itertools.count(1):
        candidate = f"{name}__{k}"
        if candidate not in taken:
            return candidate
    raise AssertionError("unreachable")


def to_model_proto(graph: Graph, reuse_protos: bool = True, deferred: Deferred | None = None,
                   constant_nodes: bool = True) -> onnx.ModelProto:
    """Build a ModelProto for the graph; initializers that live in external files stay references.

    With ``deferred`` (a dict to fill), inline initializers of at least MIN_EXTERNAL_TENSOR bytes are
    written as headers (name, type, dims) and their sources collected there, for the data file. A source
    ``Constant`` node's value is written back as that node (``constant_nodes``, so that an unchanged model
    round-trips as it was), or as an initializer (``constant_nodes`` False: how a rewritten model is written, as
    onnxsim and onnxslim write it; ONNX Runtime treats the two alike; IR versions below 4, whose initializers must
    also be graph inputs, keep the nodes)."""
    if graph.context is None:
        raise ValueError("graph has no model context (it was not loaded from ONNX)")
    model = onnx.ModelProto()
    model.CopyFrom(graph.context.template)
    nodes, new_constants = encode_nodes(graph, reuse_protos)
    used = {name for n in nodes for name in n.input} | set(graph.outputs)
    for n in graph.nodes:
        used.update(n.implicit)
    keep_nodes = constant_nodes or model.ir_version < 4
    as_nodes = written_as_nodes(graph.constants) if keep_nodes else {}  # written as the node it was
    nodes = with_constant_nodes(nodes, as_nodes, used)
    model.graph.node.extend(nodes)
    import_node_domains(model)
    for name, const in graph.constants.items():
        if name in used and name not in as_nodes:
            model.graph.initializer.append(_tensor_proto(name, const, deferred))
    for name, array in new_constants.items():
        model.graph.initializer.append(_tensor_proto(name, Constant.from_array(array), deferred))
    written = {t.name for t in model.graph.initializer}
    # Old IR versions list initializers among the inputs: drop the ones no longer written (they would
    # become required runtime inputs), and list new ones there (the checker requires it before IR 4).
    kept_inputs = [vi for vi in model.graph.input if vi.name in graph.inputs or vi.name in written]
    del model.graph.input[:]
    model.graph.input.extend(kept_inputs)
    if model.ir_version < 4:
        listed = {vi.name for vi in model.graph.input}
        for tensor in model.graph.initializer:
            if tensor.name not in listed:
                model.graph.input.append(onnx.helper.make_tensor_value_info(
                    tensor.name, tensor.data_type, list(tensor.dims)))
    live = set(graph.types) & ({o for n in graph.nodes for o in n.outputs} | (used & as_nodes.keys()))
    kept_info = [vi for vi in model.graph.value_info if vi.name in live]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept_info)
    return model


def import_node_domains(model: onnx.ModelProto) -> None:
    """Add an opset import for each domain the graph's nodes use and the model does not import yet (a
    fused ONNX Runtime kernel a rewrite wrote); the model's own imports are kept as they are."""
    imported = {imp.domain for imp in model.opset_import}
    for node in model.graph.node:
        if node.domain not in DEFAULT_DOMAINS and node.domain not in imported:
            model.opset_import.append(onnx.helper.make_opsetid(node.domain, DOMAIN_VERSIONS.get(node.domain, 1)))
            imported.add(node.domain)


_SHAPE_LIKE = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32})


def may_externalize(data_type: int, dims) -> bool:  # noqa: ANN001 - any sequence of ints
    """Whether a tensor may go to external data: not strings (ONNX cannot store them there), and not
    1-D integer tensors, which are shapes, sizes, axes or pads that shape inference and ONNX Runtime
    must read from the model itself (they refuse external ones)."""
    if data_type == onnx.TensorProto.STRING:
        return False
    return not (data_type in _SHAPE_LIKE and dims is not None and len(dims) <= 1)


def _tensor_proto(name: str, const: Constant, deferred: Deferred | None = None) -> onnx.TensorProto:
    if (deferred is not None and not const.is_external and may_externalize(const.type.dtype, const.type.shape)
            and const.nbytes >= MIN_EXTERNAL_TENSOR):
        header = onnx.TensorProto(name=name, data_type=const.type.dtype)
        header.dims.extend(const.type.static_shape)
        deferred[name] = const.array if const.array is not None else const.proto  # type: ignore[assignment]
        return header
    if const.proto is not None:
        if const.proto.name == name:
            return const.proto
        proto = onnx.TensorProto()
        proto.CopyFrom(const.proto)
        proto.name = name
        return proto
    return numpy_helper.from_array(const.value(), name)


@dataclass
class _Streamed:
    """An external tensor of the source copied into the new data file."""

    const: Constant | None
    source: str  # the file it was read from
    base_dir: str  # the folder its location was relative to
    offset: int  # where it now is in the new data file
    length: int


def _externalize(model: onnx.ModelProto, graph: Graph, data_path: str, location: str, force: bool,
                 streamed: list[_Streamed], deferred: Deferred | None = None) -> bool:
    """Move weights into ``data_path`` (referred to as ``location`` in the model): original external
    tensors are streamed from their files (never two copies in memory; listed in ``streamed``),
    ``deferred`` ones written from their arrays or source protos, large inline ones written out.
    Returns True if any was written."""
    default_dir = graph.context.base_dir if graph.context else ""
    if not force and model.ByteSize() < EXTERNAL_THRESHOLD:
        return False
    wrote = False
    buffer = memoryview(bytearray(COPY_BUFFER))  # one buffer for every streamed tensor
    with open(data_path, "wb") as out:
        for tensor in model.graph.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in tensor.external_data}
                const = graph.constants.get(tensor.name)
                base_dir = const.base_dir if const is not None and const.base_dir else default_dir
                src = os.path.join(base_dir, info["location"])
                offset, length = int(info.get("offset", 0)), info.get("length")
                try:
                    f = open(src, "rb")  # closed by the with below
                except OSError as exc:
                    raise XflowError(src, f"cannot read external data: {exc.strerror or exc}") from None
                with f:
                    f.seek(offset)
                    remaining = int(length) if length is not None else os.path.getsize(src) - offset
                    start = _align(out)
                    while remaining > 0:
                        got = f.readinto(buffer[:min(remaining, COPY_BUFFER)])
                        if not got:
                            raise XflowError(src, "external data file is shorter than the model says")
                        out.write(buffer[:got])
                        remaining -= got
                    size = out.tell() - start
                streamed.append(_Streamed(const, src, base_dir, start, size))
            elif deferred is not None and tensor.name in deferred:
                start = _align(out)
                size = _write_deferred(out, deferred[tensor.name])
            elif not may_externalize(tensor.data_type, tensor.dims):
                continue
            else:
                if not tensor.HasField("raw_data"):  # typed fields: their raw (packed, little-endian) form
                    raw = numpy_helper.from_array(numpy_helper.to_array(tensor)).raw_data
                else:
                    raw = tensor.raw_data
                if len(raw) < MIN_EXTERNAL_TENSOR:
                    continue
                start = _align(out)
                out.write(raw)
                size = len(raw)
                _clear_data(tensor)
            point_at_external(tensor, location, start, size)
            wrote = True
    return wrote


def _write_deferred(out, source: np.ndarray | onnx.TensorProto) -> int:  # noqa: ANN001 - binary file
    """Write a deferred initializer's bytes (ONNX raw form: packed, little-endian); returns the count."""
    if isinstance(source, onnx.TensorProto):
        if source.HasField("raw_data"):
            raw = source.raw_data  # one tensor's bytes at a time
            out.write(raw)
            return len(raw)
        source = numpy_helper.to_array(source)  # typed fields (float_data, ...): their packed form
    array = np.ascontiguousarray(source)
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and sys.byteorder == "big"):
        array = array.astype(array.dtype.newbyteorder("<"))
    out.write(memoryview(array.reshape(-1)).cast("B"))  # no copy of the array
    return array.nbytes


def _repoint_overwritten(streamed: list[_Streamed], data_path: str) -> None:
    """When the new data file replaced a file the graph's constants were read from (saving over the
    source model), point those constants at their bytes in the new file: the old offsets are gone.
    (Constants of the source that this graph no longer has cannot be repointed.)"""
    target = os.path.realpath(data_path)
    for item in streamed:
        if item.const is None or item.const.proto is None or os.path.realpath(item.source) != target:
            continue
        proto = item.const.proto
        location = os.path.relpath(target, os.path.realpath(item.base_dir or "."))
        point_at_external(proto, location, item.offset, item.length)


def point_at_external(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Make ``tensor`` a reference to ``length`` bytes at ``offset`` of the data file ``location``."""
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _align(f, alignment: int = 64) -> int:  # noqa: ANN001 - binary file
    pos = f.tell()
    pad = (-pos) % alignment
    if pad:
        f.write(b"\0" * pad)
    return pos + pad


def _clear_data(tensor: onnx.TensorProto) -> None:
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data",
                  "string_data"):
        tensor.ClearField(field)


def save(graph: Graph, path: str, reuse_protos: bool = True, external_data: bool | None = None,
         scratch: str | None = None, constant_nodes: bool = True) -> int:
    """Write the graph to ``path`` atomically (temp file + rename; nothing left on failure). The temp
    files go in ``scratch`` (a run's folder in the same directory, see ``xflow.files``) or beside ``path``.

    Weights go to ``<path>.data`` when the source model kept them external, when ``external_data``
    is True, or when they add up to EXTERNAL_THRESHOLD bytes (well below protobuf's 2 GB limit). Then
    no weight is copied into the model proto: external ones are streamed from their files through one
    buffer, inline and new ones written from their source; ``constant_nodes`` as ``to_model_proto``'s. Returns how
    many ONNX nodes the model written has."""
    external = bool(external_data) or (graph.context is not None and graph.context.external_data) or \
        any(c.is_external for c in graph.constants.values()) or \
        sum(c.nbytes for c in graph.constants.values()
            if not (constant_nodes and isinstance(c, NodeConstant))) >= EXTERNAL_THRESHOLD
    deferred: Deferred | None = {} if external else None
    model = to_model_proto(graph, reuse_protos, deferred, constant_nodes)
    write_model_atomically(model, graph, path, force_external=external, deferred=deferred, scratch=scratch)
    return len(model.graph.node)


def would_overwrite(graph: Graph, path: str) -> str | None:
    """The file the graph's weights are read from (external data of the source model) that writing the
    graph to ``path`` (and ``<path>.data``) would replace, or None. ``save`` allows it (the constants
    are repointed), but it changes the input on disk: ``xflow optimize`` refuses it."""
    targets = {os.path.realpath(path), os.path.realpath(path + ".data")}
    return next((source for source in weight_files(graph) if source in targets), None)


def weight_files(graph: Graph) -> list[str]:
    """The files the graph's external weights are read from (resolved paths, in the order first met)."""
    default_dir = graph.context.base_dir if graph.context else ""
    files: dict[str, None] = {}
    for const in graph.constants.values():
        if const.is_external:
            location = {e.key: e.value for e in const.proto.external_data}.get("location", "")  # type: ignore[union-attr]
            files[os.path.realpath(os.path.join(const.base_dir or default_dir, location))] = None
    return list(files)


def write_model_atomically(model: onnx.ModelProto, graph: Graph, path: str, force_external: bool,
                           deferred: Deferred | None = None, scratch: str | None = None) -> None:
    """Serialize ``model`` next to ``path`` (or in ``scratch``) in temp files, then rename them into place."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    temp_dir = scratch or directory
    if not os.path.isdir(directory):
        raise XflowError(path, "output directory does not exist")
    if os.path.isdir(path):
        raise XflowError(path, "is a directory")
    data_name = os.path.basename(path) + ".data"
    tmp_model = tmp_data = placed_data = previous_data = None
    placed = False
    streamed: list[_Streamed] = []
    try:
        # Temp names made here (not mkstemp, whose 0600 mode the renamed model would keep): the files
        # get the usual umask-based permissions.
        token = f"{os.getpid()}.{secrets.token_hex(6)}"
        tmp_model = os.path.join(temp_dir, f".{os.path.basename(path)}.{token}.xflow-tmp")
        tmp_data = os.path.join(temp_dir, f".{data_name}.{token}.xflow-tmp")
        with open(tmp_model, "xb"):
            pass
        wrote_data = _externalize(model, graph, tmp_data, data_name, force_external, streamed, deferred)
        with open(tmp_model, "wb") as f:
            f.write(model.SerializeToString())
        if wrote_data:
            target = os.path.join(directory, data_name)
            if os.path.exists(target):  # a previous output's data: put back if the model is not placed
                backup = os.path.join(temp_dir, f".{data_name}.{token}.xflow-previous")
                os.replace(target, backup)
                previous_data = backup
            os.replace(tmp_data, target)
            placed_data = target
        os.replace(tmp_model, path)
        placed = True
        tmp_model = placed_data = None
        if wrote_data:
            _repoint_overwritten(streamed, os.path.join(directory, data_name))
    except OSError as exc:
        raise XflowError(path, f"cannot write: {exc.strerror or exc}") from None
    except ValueError as exc:  # protobuf refuses messages over 2 GB
        raise XflowError(path, f"cannot serialize model: {exc}") from None
    finally:
        for leftover in (tmp_model, tmp_data, placed_data):  # placed_data: the model's rename failed
            if leftover and os.path.exists(leftover):
                with contextlib.suppress(OSError):
                    os.remove(leftover)
        if previous_data is not None:  # dropped once the new model is placed, else put back
            with contextlib.suppress(OSError):
                if placed:
                    os.remove(previous_data)
                else:
                    os.replace(previous_data, os.path.join(directory, data_name))

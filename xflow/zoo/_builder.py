"""GraphBuilder: assemble an ONNX graph with unique names, tracked static shapes and seeded weights."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

OPSET = 17
IR_VERSION = 8
PRODUCER = "xflow.zoo"

Shape = tuple[int, ...]


class GraphBuilder:
    """Accumulates the nodes, inputs, outputs and initializers of one ONNX graph.

    Every value gets a unique name (scoped with :meth:`scope`) and a statically known shape and
    dtype, so layer helpers can compute channel counts and spatial sizes without shape inference.
    """

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[str] = []
        self.initializers: list[onnx.TensorProto] = []
        self._shapes: dict[str, Shape] = {}
        self._dtypes: dict[str, np.dtype] = {}
        self._used: set[str] = set()
        self._counters: dict[str, int] = {}
        self._scope: list[str] = []
        self._consts: dict[tuple[str, Shape, bytes], str] = {}

    # ------------------------------------------------------------------ naming
    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix every name created inside the ``with`` block by ``name/``."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    def fresh(self, hint: str, scoped: bool = True) -> str:
        """Return a graph-unique name built from the current scope and ``hint``."""
        base = "/".join([*self._scope, hint]) if scoped else hint
        if base not in self._used:
            self._used.add(base)
            return base
        k = self._counters.get(base, 1)
        while f"{base}_{k}" in self._used:
            k += 1
        self._counters[base] = k + 1
        name = f"{base}_{k}"
        self._used.add(name)
        return name

    def _register(self, name: str, shape: Sequence[int], dtype: Any) -> None:
        self._shapes[name] = tuple(int(d) for d in shape)
        self._dtypes[name] = np.dtype(dtype)

    # ------------------------------------------------------------------ queries
    def shape(self, value: str) -> Shape:
        """Static shape of a value created by this builder."""
        return self._shapes[value]

    def dtype(self, value: str) -> np.dtype:
        """Numpy dtype of a value created by this builder."""
        return self._dtypes[value]

    # ------------------------------------------------------------------ graph I/O and tensors
    def add_input(self, name: str, shape: Sequence[int], dtype: Any = np.float32) -> str:
        """Declare a graph input with a static shape."""
        if name in self._used:
            raise ValueError(f"name {name!r} already used")
        self._used.add(name)
        self._register(name, shape, dtype)
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(self._shapes[name])))
        return name

    def add_output(self, value: str, name: str | None = None) -> str:
        """Mark a node output as a graph output, optionally renaming it to ``name``."""
        if name is not None and name != value:
            if name in self._used:
                raise ValueError(f"name {name!r} already used")
            self._used.add(name)
            for node in self.nodes:
                for i, inp in enumerate(node.input):
                    if inp == value:
                        node.input[i] = name
                for i, out in enumerate(node.output):
                    if out == value:
                        node.output[i] = name
            self._register(name, self._shapes[value], self._dtypes[value])
            value = name
        self.outputs.append(value)
        return value

    def initializer(self, hint: str, array: np.ndarray) -> str:
        """Add ``array`` as an initializer with a unique scoped name."""
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        self._register(name, array.shape, array.dtype)
        return name

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        """A shared constant initializer (deduplicated by dtype, shape and value)."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            name = self.fresh("const", scoped=False)
            self.initializers.append(numpy_helper.from_array(arr, name))
            self._register(name, arr.shape, arr.dtype)
            self._consts[key] = name
        return self._consts[key]

    def normal(self, hint: str, shape: Sequence[int], std: float, mean: float = 0.0) -> str:
        """A float32 initializer drawn from N(mean, std^2)."""
        arr = self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std) + np.float32(mean)
        return self.initializer(hint, arr.astype(np.float32, copy=False))

    def uniform(self, hint: str, shape: Sequence[int], low: float, high: float) -> str:
        """A float32 initializer drawn from U(low, high)."""
        arr = self.rng.uniform(low, high, size=tuple(shape)).astype(np.float32)
        return self.initializer(hint, arr)

    # ------------------------------------------------------------------ nodes
    def node(
        self,
        op_type: str,
        inputs: Sequence[str],
        shape: Sequence[int],
        dtype: Any = None,
        name: str | None = None,
        **attrs: Any,
    ) -> str:
        """Append a single-output node; returns the output value name (== the node name)."""
        out = self.fresh(name or op_type)
        out_dtype = dtype if dtype is not None else self._dtypes[inputs[0]]
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        self._register(out, shape, out_dtype)
        return out

    def unary(self, op_type: str, x: str, **attrs: Any) -> str:
        """Shape-preserving single-input node (Relu, Sigmoid, Tanh, Erf, ...)."""
        return self.node(op_type, [x], self.shape(x), **attrs)

    def binary(self, op_type: str, a: str, b: str) -> str:
        """Broadcasting elementwise node (Add, Sub, Mul, Div)."""
        shape = np.broadcast_shapes(self.shape(a), self.shape(b))
        dtype = self.dtype(a) if self.dtype(a) == self.dtype(b) else np.result_type(self.dtype(a), self.dtype(b))
        return self.node(op_type, [a, b], shape, dtype=dtype)

    def add(self, a: str, b: str) -> str:
        """Elementwise Add."""
        return self.binary("Add", a, b)

    def mul(self, a: str, b: str) -> str:
        """Elementwise Mul."""
        return self.binary("Mul", a, b)

    def matmul(self, a: str, b: str) -> str:
        """MatMul of two tensors of rank >= 2 (numpy semantics)."""
        sa, sb = self.shape(a), self.shape(b)
        if len(sa) < 2 or len(sb) < 2 or sa[-1] != sb[-2]:
            raise ValueError(f"MatMul shape mismatch: {sa} @ {sb}")
        batch = np.broadcast_shapes(sa[:-2], sb[:-2])
        return self.node("MatMul", [a, b], (*batch, sa[-2], sb[-1]))

    # ------------------------------------------------------------------ finish
    def to_model(self, doc: str = "") -> onnx.ModelProto:
        """Assemble the ModelProto (opset 17, IR 8) and fill value_info by strict shape inference."""
        outputs = [
            helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(self._dtypes[o]), list(self._shapes[o]))
            for o in self.outputs
        ]
        graph = helper.make_graph(self.nodes, self.name, self.inputs, outputs, self.initializers, doc_string=doc)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER)
        model.ir_version = IR_VERSION
        model.doc_string = doc
        inferred = self._infer_skeleton(model)
        self._check_inferred(inferred)
        model.graph.value_info.extend(inferred.graph.value_info)
        return model

    def _infer_skeleton(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """Strict shape inference on a weight-free copy (large initializers become typed inputs).

        Shape inference only reads the values of small integer tensors (Reshape shapes, axes, pads),
        so dropping the float weights gives the same result without serializing hundreds of MB.
        """
        keep, typed = [], []
        for t in model.graph.initializer:
            if t.data_type == onnx.TensorProto.FLOAT and int(np.prod(t.dims)) > 16:
                typed.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
            else:
                keep.append(t)
        graph = helper.make_graph(
            list(model.graph.node),
            model.graph.name,
            [*model.graph.input, *typed],
            list(model.graph.output),
            keep,
        )
        skeleton = helper.make_model(graph, opset_imports=list(model.opset_import))
        skeleton.ir_version = model.ir_version
        return onnx.shape_inference.infer_shapes(skeleton, check_type=True, strict_mode=True, data_prop=True)

    def _check_inferred(self, model: onnx.ModelProto) -> None:
        """Every value must have a fully static inferred shape equal to the tracked one."""
        infos = list(model.graph.value_info) + list(model.graph.output)
        seen = {vi.name for vi in infos}
        for vi in infos:
            dims = vi.type.tensor_type.shape.dim
            shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims)
            expected = self._shapes.get(vi.name)
            if expected is not None and shape != expected:
                raise AssertionError(f"{self.name}: {vi.name} inferred {shape}, tracked {expected}")
        missing = [out for n in model.graph.node for out in n.output if out not in seen]
        if missing:
            raise AssertionError(f"{self.name}: no inferred shape for {missing[:5]}")

"""Copies of a model that leave its weights behind (shape inference and shape observation runs)."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import onnx

INLINE_ELEMENTS = 4096  # initializers up to this size keep their values (shape targets, axes, ...)


def elements(tensor: onnx.TensorProto) -> int:
    """Number of elements of an initializer."""
    return int(np.prod(list(tensor.dims), dtype=np.int64))


def copy_fields(src, dst, skip: tuple[str, ...]) -> None:  # noqa: ANN001 - any protobuf message
    """Copy every set field of ``src`` into ``dst`` except those named in ``skip``."""
    for field, value in src.ListFields():
        if field.name in skip:
            continue
        if field.is_repeated:
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def weights_as_inputs(model: onnx.ModelProto, names: Collection[str]) -> onnx.ModelProto:
    """A copy of the model in which the initializers ``names`` are typed graph inputs instead (their data is
    not copied)."""
    shell = onnx.ModelProto()
    copy_fields(model, shell, skip=("graph",))
    copy_fields(model.graph, shell.graph, skip=("initializer",))
    shell.graph.initializer.extend(t for t in model.graph.initializer if t.name not in names)
    declared = {vi.name for vi in model.graph.input}
    for t in model.graph.initializer:
        if t.name in names and t.name not in declared:
            shell.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return shell

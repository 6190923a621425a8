"""The sliding-window helpers of the window ops (conv, pooling, pad): output geometry, auto_pad, windows of an
array as a gathered copy or a strided view, padding, menu padding and the z3 facts of a window's shape. Defines no
operator."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xflow.ir import Shape
from xflow.ops.base import ShapeError, ShapeFacts


def window_output(op: str, spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                  pads: Sequence[int]) -> Shape:
    """Output (OH, OW) of a dilation-1, floor-mode window; raises ShapeError on invalid geometry."""
    if len(kernel) != 2 or min(kernel) < 1:
        raise ShapeError(f"{op}: kernel {tuple(kernel)} must be two positive ints")
    if len(strides) != 2 or min(strides) < 1:
        raise ShapeError(f"{op}: strides {tuple(strides)} must be two positive ints")
    if len(pads) != 4 or min(pads) < 0:
        raise ShapeError(f"{op}: pads {tuple(pads)} must be four non-negative (top, left, bottom, right)")
    out = tuple((d + pads[i] + pads[i + 2] - k) // s + 1
                for i, (d, k, s) in enumerate(zip(spatial, kernel, strides, strict=True)))
    if min(out) < 1:
        raise ShapeError(f"{op}: kernel {tuple(kernel)} exceeds input {tuple(spatial)} padded {tuple(pads)}")
    return out


#: Windows of at most this many elements are gathered through a cached index table (a few numpy calls on the
#: generator's small tensors, where a padded copy and a strided view cost twice as much); larger ones are read
#: through a strided view, so the tables stay small.
GATHER_LIMIT = 1 << 16


def padded(xp: Any, x: Any, pads: Sequence[int], fill: Any) -> Any:
    """``x`` with ``pads`` (ONNX order: every begin, then every end) of ``fill`` around it: a filled array and
    one slice copy, where ``np.pad`` costs about ten times that on the generator's small tensors."""
    rank = x.ndim
    out = xp.full(tuple(d + pads[i] + pads[i + rank] for i, d in enumerate(x.shape)), fill, dtype=x.dtype)
    out[tuple(slice(pads[i], pads[i] + d) for i, d in enumerate(x.shape))] = x
    return out


def _strided_windows(xp: Any, x: Any, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                     fill: Any) -> Any:
    top, left, bottom, right = pads
    if top or left or bottom or right:
        x = padded(xp, x, (0, 0, top, left, 0, 0, bottom, right), fill)
    n, c, h, w = x.shape
    (kh, kw), (sh, sw) = kernel, strides
    shape = (n, c, (h - kh) // sh + 1, (w - kw) // sw + 1, kh, kw)
    s = x.strides
    return xp.lib.stride_tricks.as_strided(x, shape, (s[0], s[1], s[2] * sh, s[3] * sw, s[2], s[3]))


@functools.lru_cache(maxsize=512)
def _window_index(xp: Any, shape: Shape, kernel: Shape, strides: Shape, pads: Shape, group: int) -> Any:
    """Per window element, its position in the input flattened (``size`` for the padding), as an ``xp`` array
    of shape (N, C, OH, OW, kh, kw) for ``group`` 0, else conv's columns (N, group, OH*OW, C/group*kh*kw);
    None past ``GATHER_LIMIT``."""
    size = int(np.prod(shape))
    index = _strided_windows(np, np.arange(size, dtype=np.intp).reshape(shape), kernel, strides, pads, size)
    if index.size > GATHER_LIMIT:
        return None
    if group:
        n, c, oh, ow, kh, kw = index.shape
        cg = c // group
        index = index.reshape(n, group, cg, oh, ow, kh, kw).transpose(0, 1, 3, 4, 2, 5, 6)
        index = index.reshape(n, group, oh * ow, cg * kh * kw)
    return xp.asarray(np.ascontiguousarray(index))


def _gathered(xp: Any, x: Any, index: Any, fill: Any) -> Any:
    flat = xp.empty(x.size + 1, dtype=x.dtype)
    flat[:-1] = x.reshape(-1)
    flat[-1] = fill
    return flat[index]


def sliding_windows(xp: Any, x: Any, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                    fill: Any = 0) -> Any:
    """Windows of an NCHW array padded with ``fill``, shape (N, C, OH, OW, kh, kw): a gathered copy, or a
    strided view past ``GATHER_LIMIT`` (read it, never write it)."""
    index = _window_index(xp, tuple(x.shape), tuple(kernel), tuple(strides), tuple(pads), 0)
    if index is None:
        return _strided_windows(xp, x, kernel, strides, pads, fill)
    return _gathered(xp, x, index, fill)


def conv_columns(xp: Any, x: Any, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                 group: int) -> Any:
    """The windows of an NCHW array (zero padding) as a conv's columns: (N, group, OH*OW, C/group*kh*kw)."""
    shape, kernel, strides, pads = tuple(x.shape), tuple(kernel), tuple(strides), tuple(pads)
    index = _window_index(xp, shape, kernel, strides, pads, group)
    if index is not None:
        return _gathered(xp, x, index, 0)
    win = _strided_windows(xp, x, kernel, strides, pads, 0)
    n, c, oh, ow, kh, kw = win.shape
    cols = win.reshape(n, group, c // group, oh, ow, kh, kw).transpose(0, 1, 3, 4, 2, 5, 6)
    return cols.reshape(n, group, oh * ow, c // group * kh * kw)


def decode_geometry(attrs: Mapping[str, Any], spatial: Shape, kernel: Shape) -> tuple[Shape, Shape] | None:
    """(strides, pads) of an ONNX Conv/Pool node with auto_pad resolved against static shapes, or None
    when the attributes are outside what the op table handles (dilation != 1, wrong rank, ...)."""
    strides = tuple(int(s) for s in attrs.get("strides", (1, 1)))
    pads = tuple(int(p) for p in attrs.get("pads", (0, 0, 0, 0)))
    dilations = tuple(int(d) for d in attrs.get("dilations", (1, 1)))
    auto_pad = attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if len(strides) != 2 or min(strides) < 1 or len(pads) != 4 or dilations != (1, 1):
        return None
    if auto_pad == "NOTSET":
        return strides, pads
    if any(pads) or auto_pad not in ("VALID", "SAME_UPPER", "SAME_LOWER"):
        return None
    if auto_pad == "VALID":
        return strides, (0, 0, 0, 0)
    begin, end = [], []
    for d, k, s in zip(spatial, kernel, strides, strict=True):
        total = max(0, (-(-d // s) - 1) * s + k - d)
        small, big = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else big)
        end.append(big if auto_pad == "SAME_UPPER" else small)
    return strides, tuple(begin + end)








def same_pads(kernel: Sequence[int]) -> tuple[int, int, int, int]:
    """The pads that keep a stride-1 window's output the size of its input (the larger half at the end)."""
    ph, pw = (kernel[0] - 1) // 2, (kernel[1] - 1) // 2
    return (ph, pw, kernel[0] - 1 - ph, kernel[1] - 1 - pw)


def menu_padding(attrs: dict[str, Any], kernel: Sequence[int]) -> None:
    """Resolve a menu entry's ``padding`` ("same", "valid" or explicit pads) into ``pads`` for this kernel
    size."""
    padding = attrs.pop("padding")
    attrs["pads"] = same_pads(kernel) if padding == "same" else (0, 0, 0, 0) if padding == "valid" else padding


def window_facts(f: ShapeFacts, attrs: Mapping[str, Any], args: Sequence[Any]) -> list[Any]:
    """A window op reads a 4-D input, with non-negative pads and positive strides."""
    return [f.rank(args[0]) == 4, *pads_and_strides_facts(attrs)]


def window_output_facts(f: ShapeFacts, window: Sequence[Any], attrs: Mapping[str, Any], image: Any,
                        out: Any) -> list[Any]:
    """The output of a window of ``window`` (kh, kw) over ``image``: 4-D, the image's batch, and per spatial axis
    ``(size + pads - k) // stride + 1`` with the window inside the padded image (``window_output``). No facts for
    a variable stride: a division by an unknown is not linear, and z3 would give up on every proof holding it."""
    strides, pads = attrs.get("strides", ()), attrs.get("pads", ())
    if len(strides) != 2 or len(pads) != 4 or any(f.symbolic(s) for s in strides):
        return []
    facts = [f.rank(out) == 4, f.dim(out, 0) == f.dim(image, 0)]
    for axis in (0, 1):
        padded = f.dim(image, 2 + axis) + pads[axis] + pads[axis + 2]
        facts += [window[axis] >= 1, padded >= window[axis],
                  f.dim(out, 2 + axis) == f.div(padded - window[axis], strides[axis]) + 1]
    return facts


def pool_output_facts(f: ShapeFacts, attrs: Mapping[str, Any], args: Sequence[Any],
                      outs: Sequence[Any]) -> list[Any]:
    """A pool's output: the image's channels, and the window's geometry (``window_output_facts``)."""
    return [f.dim(outs[0], 1) == f.dim(args[0], 1),
            *window_output_facts(f, attrs.get("kernel", ()), attrs, args[0], outs[0])]


def pads_and_strides_facts(attrs: Mapping[str, Any]) -> list[Any]:
    """What ``window_output`` requires of a window's pads (non-negative) and strides (positive): facts about a
    rule's pads or strides when they are variables (literal ones give True, which the verifier drops)."""
    return [p >= 0 for p in attrs.get("pads", ())] + [s >= 1 for s in attrs.get("strides", ())]

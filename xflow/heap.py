"""Handing the C heap's free memory back to the operating system.

ONNX Runtime allocates a session's weights, prepacked copies and run buffers with malloc; when the session is
released, glibc keeps most of those pages as free heap of the process instead of returning them, so each session a
run makes and drops leaves its size behind and the process's memory climbs with every A/B pair (ConvNeXt-tiny:
three sessions made and released left 240 MB of 315 MB resident). ``trim`` returns them (``malloc_trim``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to hand back this way
        return None


def trim() -> None:
    """Return the process's free heap pages to the operating system (glibc); nothing elsewhere."""
    release = _malloc_trim()
    if release is not None:
        release(0)

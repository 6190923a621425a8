"""What every pass of ``optimize`` returns, after onnx-ir's ``PassResult`` (``passes/_pass_infra.py``): the
graph it hands on and whether it changed it; each pass's result adds its own figures, which ``report`` reads."""

from __future__ import annotations

from dataclasses import dataclass

from xflow.ir import Graph


@dataclass(kw_only=True)
class PassResult:
    """``graph``: what the pass hands on (None: nothing but the original to write); ``modified``: whether it
    differs from what the pass was given."""

    graph: Graph | None
    modified: bool = False

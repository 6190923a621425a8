"""The parts of a rule's patterns: nodes over named tensors whose attributes are templates (a literal, a
variable ``?v``, an expression ``=expr``, or a tuple of those)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xflow.rules.expr import Expr


@dataclass(frozen=True)
class Var:
    """An attribute variable (``"?name"``)."""

    name: str


AttrTemplate = Any  # literal | Var | Expr | tuple of those


@dataclass(frozen=True)
class PatternNode:
    """One node of a pattern: op, input and output tensor names, attribute templates."""

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, AttrTemplate]

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        out: dict[str, Any] = {"op": self.op, "in": list(self.inputs), "out": list(self.outputs)}
        if self.attrs:
            out["attrs"] = {k: template_to_json(v) for k, v in self.attrs.items()}
        return out


def template_vars(template: AttrTemplate) -> list[Var]:
    """The variables a template mentions, in order."""
    if isinstance(template, Var):
        return [template]
    if isinstance(template, tuple):
        return [v for t in template for v in template_vars(t)]
    return []


def template_to_json(template: AttrTemplate) -> Any:
    """The JSON form of a template."""
    if isinstance(template, Var):
        return f"?{template.name}"
    if isinstance(template, Expr):
        return f"={template.source}"
    if isinstance(template, tuple):
        return [template_to_json(t) for t in template]
    return template

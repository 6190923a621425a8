"""The op table is the one place an operator's meaning lives: code outside ``xflow/ops`` does not name
op-table ops as string literals (it reads the table's fields, or refers to an entry by its ``OpDef``)."""

from __future__ import annotations

import ast
from pathlib import Path

from xflow.ops import OPS

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("xflow", "verifier", "generator")
#: Statements about ops rather than re-declarations of them: the z3 axioms, and what ONNX Runtime fuses.
EXEMPT = frozenset({"verifier/axioms.py", "xflow/cost/fusion.py"})
MOST_LINES = 25


def _attribute_keys(tree: ast.AST) -> set[int]:
    """ids of string constants used as a key into an attribute mapping (``node.attrs["split"]``): split's
    sizes attribute shares the op's name but is not the op."""
    keys = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            target = node.value
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name == "attrs":
                keys.add(id(node.slice))
    return keys


def op_literal_lines(source: str, ops: frozenset[str]) -> list[int]:
    """Line numbers of string literals in ``source`` that are an op-table op's name."""
    tree = ast.parse(source)
    keys = _attribute_keys(tree)
    return sorted({node.lineno for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ops
                   and id(node) not in keys})


def _hits() -> list[str]:
    ops = frozenset(OPS)
    hits = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("xflow/ops/") or rel in EXEMPT:
                continue
            text = path.read_text()
            lines = text.splitlines()
            hits += [f"{rel}:{n}: {lines[n - 1].strip()}" for n in op_literal_lines(text, ops)]
    return hits


def test_few_lines_outside_the_op_table_name_an_op():
    hits = _hits()
    assert len(hits) <= MOST_LINES, f"{len(hits)} lines name an op outside xflow/ops:\n" + "\n".join(hits)


def test_the_count_sees_op_names_and_skips_attribute_keys():
    source = 'if node.op == "conv":\n    pass\nsizes = node.attrs["split"]\nx = OPS["split"]\n'
    assert op_literal_lines(source, frozenset({"conv", "split"})) == [1, 4]

"""The small expression language of rule attributes and conditions.

An expression is Python syntax restricted to: integers, tuples/lists, attribute variables (bound by
``?name`` in the source pattern), ``rank(t)``, ``dim(t, i)``, ``shape(t)`` of pattern tensors,
``len/sum/min/max/abs/all/any``, arithmetic (+ - * // %), comparisons, ``and/or/not``, subscripts
and ``a if c else b``. Parsed once when a rule is loaded; evaluated per match.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

#: Bounds on what an expression may be and compute: its text, its nesting, and the items (and integer digits)
#: one value may hold. A rule is data from a file: ``len('a' * 100000000000)`` passes the whitelist and would
#: allocate without bound at every match, and 100,000 nested minuses exhaust the parser's memory.
MAX_SOURCE_CHARS = 2000
MAX_DEPTH = 64
MAX_ITEMS = 10_000
MAX_INT_BITS = 256


def _bounded(value: Any) -> Any:
    """``value`` when within the bounds, else ExprError (a sequence of more than MAX_ITEMS items, an integer of
    more than MAX_INT_BITS bits)."""
    if isinstance(value, str | tuple | list) and len(value) > MAX_ITEMS:
        raise ExprError(f"a value of {len(value)} items (at most {MAX_ITEMS})")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ExprError(f"an integer of {value.bit_length()} bits (at most {MAX_INT_BITS})")
    return value


def _mul(a: Any, b: Any) -> Any:
    """``a * b`` refused before it allocates: a sequence repeated beyond MAX_ITEMS items."""
    for seq, count in ((a, b), (b, a)):
        if isinstance(seq, str | tuple | list) and isinstance(count, int) and len(seq) * max(count, 0) > MAX_ITEMS:
            raise ExprError(f"a value of {len(seq) * count} items (at most {MAX_ITEMS})")
    return _bounded(a * b)


def _mod(a: Any, b: Any) -> Any:
    """Integer ``a % b``; a string left side would be printf formatting (``'%09999999d' % 1`` allocates)."""
    if not isinstance(a, int):
        raise ExprError(f"% takes integers, not {type(a).__name__}")
    return a % b


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: _bounded(operator.add(a, b)), ast.Sub: operator.sub, ast.Mult: _mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: _mod,
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}
def _sum(items: Any, start: Any = 0) -> Any:
    """``sum`` of numbers (a sum of sequences would concatenate without bound)."""
    if not isinstance(start, int):
        raise ExprError(f"sum() adds integers, not {type(start).__name__}")
    return _bounded(sum(items, start))


_PURE_FUNCS: dict[str, Callable[..., Any]] = {
    "len": len, "sum": _sum, "min": min, "max": max, "abs": abs, "all": all, "any": any,
    "tuple": tuple,
}
_SHAPE_FUNCS = ("rank", "dim", "shape")


class ExprError(ValueError):
    """An expression is malformed or refers to something unbound."""


class ShapeEnv:
    """What an expression can read: attribute variables and the shapes of pattern tensors."""

    def __init__(self, variables: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.variables = variables
        self.shapes = shapes


@dataclass(frozen=True)
class Expr:
    """A parsed expression with the variables and tensors it mentions."""

    source: str

    @cached_property
    def tree(self) -> ast.expr:
        if not isinstance(self.source, str):
            raise ExprError(f"expression {self.source!r} is not a string")
        if len(self.source) > MAX_SOURCE_CHARS:
            raise ExprError(f"expression {self.source[:40]!r}... is {len(self.source)} characters long "
                            f"(at most {MAX_SOURCE_CHARS})")
        try:
            tree = ast.parse(self.source, mode="eval").body
        except SyntaxError as exc:
            raise ExprError(f"bad expression {self.source!r}: {exc.msg}") from None
        except (MemoryError, RecursionError):
            raise ExprError(f"expression {self.source[:40]!r}... is nested too deeply") from None
        _check_depth(tree, self.source)
        _check(tree, self.source)
        return tree

    @cached_property
    def variables(self) -> frozenset[str]:
        """Attribute variables read (names outside shape functions)."""
        return frozenset(_names(self.tree, tensors=False))

    @cached_property
    def tensors(self) -> frozenset[str]:
        """Pattern tensors whose shapes are read."""
        return frozenset(_names(self.tree, tensors=True))

    @cached_property
    def _compiled(self) -> Compiled:
        return _compile(self.tree, self.source)

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source}  # what is derived from it (a closure among them) is derived again

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "source", state["source"])

    def evaluate(self, env: ShapeEnv) -> Any:
        """The value of the expression in ``env``."""
        return self._compiled(env)


def _check_depth(tree: ast.AST, source: str) -> None:
    """ExprError when the tree nests deeper than MAX_DEPTH (the compiled closures recurse once per level)."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ExprError(f"expression {source[:40]!r}... nests more than {MAX_DEPTH} levels deep")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _check(node: ast.AST, source: str) -> None:
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.Call, ast.Name, ast.Constant,
               ast.Tuple, ast.List, ast.Subscript, ast.Slice, ast.IfExp, ast.Load, ast.USub, ast.Not, ast.And,
               ast.Or, *_BINOPS, *_CMPOPS)
    for sub in ast.walk(node):
        if not isinstance(sub, allowed):
            raise ExprError(f"{source!r}: {type(sub).__name__} is not allowed in rule expressions")
        if isinstance(sub, ast.Call):
            if not isinstance(sub.func, ast.Name) or sub.func.id not in (*_PURE_FUNCS, *_SHAPE_FUNCS):
                raise ExprError(f"{source!r}: unknown function {ast.unparse(sub.func)}")
            if sub.func.id in _SHAPE_FUNCS and (not sub.args or not isinstance(sub.args[0], ast.Name)):
                raise ExprError(f"{source!r}: {sub.func.id}() takes a pattern tensor name first")
        if isinstance(sub, ast.Constant) and not isinstance(sub.value, int | str | bool):
            raise ExprError(f"{source!r}: only integer, bool and string literals are allowed")
        if isinstance(sub, ast.Constant):
            try:
                _bounded(sub.value)
            except ExprError as exc:
                raise ExprError(f"{source[:40]!r}: a literal too large: {exc}") from None


def _names(tree: ast.AST, tensors: bool) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST, in_shape_arg: bool) -> None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            for k, arg in enumerate(node.args):
                visit(arg, node.func.id in _SHAPE_FUNCS and k == 0)
            return
        if isinstance(node, ast.Name):
            if in_shape_arg == tensors:
                found.add(node.id)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, False)

    visit(tree, False)
    return found


Compiled = Callable[[ShapeEnv], Any]


def _compile(node: ast.AST, source: str) -> Compiled:
    """``node`` as a closure over an environment: an expression is evaluated at every match and every numeric
    instance, and walking its tree each time was most of what evaluating it cost."""
    match node:
        case ast.Constant(value=value):
            return lambda env: value
        case ast.Name(id=name):
            def variable(env: ShapeEnv) -> Any:
                try:
                    return env.variables[name]
                except KeyError:
                    raise ExprError(f"{source!r}: variable {name!r} is not bound") from None
            return variable
        case ast.Tuple(elts=elts) | ast.List(elts=elts):
            parts = [_compile(e, source) for e in elts]
            return lambda env: tuple(p(env) for p in parts)
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            inner = _compile(operand, source)
            return lambda env: -inner(env)
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            inner = _compile(operand, source)
            return lambda env: not inner(env)
        case ast.BinOp(left=left, op=op, right=right):
            fn, lhs, rhs = _BINOPS[type(op)], _compile(left, source), _compile(right, source)
            return lambda env: fn(lhs(env), rhs(env))
        case ast.BoolOp(op=ast.And(), values=values):
            parts = [_compile(v, source) for v in values]
            return lambda env: all(p(env) for p in parts)
        case ast.BoolOp(op=ast.Or(), values=values):
            parts = [_compile(v, source) for v in values]
            return lambda env: any(p(env) for p in parts)
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            first = _compile(left, source)
            steps = [(_CMPOPS[type(op)], _compile(right, source)) for op, right in zip(ops, comparators, strict=True)]

            def compare(env: ShapeEnv) -> bool:
                current = first(env)
                for fn, right in steps:
                    value = right(env)
                    if not fn(current, value):
                        return False
                    current = value
                return True
            return compare
        case ast.IfExp(test=test, body=body, orelse=orelse):
            cond, yes, no = _compile(test, source), _compile(body, source), _compile(orelse, source)
            return lambda env: yes(env) if cond(env) else no(env)
        case ast.Subscript(value=value, slice=index):
            container = _compile(value, source)
            if isinstance(index, ast.Slice):
                bounds = [None if p is None else _compile(p, source) for p in (index.lower, index.upper, index.step)]
                return lambda env: container(env)[slice(*(None if b is None else b(env) for b in bounds))]
            key = _compile(index, source)
            return lambda env: container(env)[key(env)]
        case ast.Call(func=ast.Name(id=fname), args=args) if fname in _SHAPE_FUNCS:
            tensor = args[0].id  # type: ignore[attr-defined]

            def shape_of(env: ShapeEnv) -> tuple[Any, ...]:
                try:
                    return env.shapes[tensor]
                except KeyError:
                    raise ExprError(f"{source!r}: tensor {tensor!r} has no known shape") from None
            if fname == "rank":
                return lambda env: len(shape_of(env))
            if fname == "shape":
                return lambda env: tuple(shape_of(env))
            at = _compile(args[1], source)
            return lambda env: shape_of(env)[at(env)]
        case ast.Call(func=ast.Name(id=fname), args=args):
            fn, parts = _PURE_FUNCS[fname], [_compile(a, source) for a in args]
            return lambda env: fn(*(p(env) for p in parts))
    raise ExprError(f"{source!r}: cannot evaluate {ast.unparse(node)}")

"""The small expression language of rule attributes and conditions.

An expression is Python syntax restricted to: integers, tuples/lists, attribute variables (bound by
``?name`` in the source pattern), ``rank(t)``, ``dim(t, i)``, ``shape(t)`` of pattern tensors, ``value(t)`` of a
one-element constant rule input (its float value as ONNX stores it, float32: an epsilon the export adds as a
constant that the fused op takes as an attribute), ``dtype(t)`` (a pattern tensor's ONNX element type),
``len/sum/min/max/abs/all/any``, arithmetic (+ - * // %), comparisons, ``and/or/not``, subscripts
and ``a if c else b``. Parsed once when a rule is loaded; evaluated per match.

One evaluator serves every meaning of the language: it is compiled against a *semantics*, a table from each
operation (``+``, ``==``, ``and``, ``if``, ``rank()``, ``len()``, ...) to the function that performs it.
``PYTHON_SEMANTICS`` evaluates on ints, tuples and shapes (the matcher's, the numeric check's); the verifier's
z3 semantics is ``PYTHON_SEMANTICS | {...}``, overriding only the operations whose meaning differs on z3 terms
(tinygrad's ``z3_alu = python_alu | {...}``).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

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


def _sum(items: Any, start: Any = 0) -> Any:
    """``sum`` of numbers (a sum of sequences would concatenate without bound)."""
    if not isinstance(start, int):
        raise ExprError(f"sum() adds integers, not {type(start).__name__}")
    return _bounded(sum(items, start))


#: The semantics operation of each AST operator.
_BINOPS: dict[type, str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}
_CMPOPS: dict[type, str] = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
                            ast.In: "in", ast.NotIn: "not in"}
_PURE_FUNCS = ("len", "sum", "min", "max", "abs", "all", "any", "tuple")
_SHAPE_FUNCS = ("rank", "dim", "shape")
_VALUE_FUNCS = ("value",)
_DTYPE_FUNCS = ("dtype",)


class ExprError(ValueError):
    """An expression is malformed or refers to something unbound."""


class ShapeEnv:
    """What an expression can read: attribute variables, the shapes of pattern tensors (what a semantics'
    ``rank``, ``dim`` and ``shape`` read: a tuple of dims in Python, a tensor term in z3) and the values of
    constant rule inputs (what ``value`` reads: an array in Python, a tensor term in z3; None: no value known)
    and the element types of pattern tensors (what ``dtype`` reads: an ONNX type in Python, a term in z3)."""

    def __init__(self, variables: Mapping[str, Any], shapes: Mapping[str, Any],
                 values: Mapping[str, Any] | None = None, dtypes: Mapping[str, Any] | None = None) -> None:
        self.variables = variables
        self.shapes = shapes
        self.values = values
        self.dtypes = dtypes


Semantics = Mapping[str, Callable[..., Any]]
"""What each operation of the language does, keyed by how it is written: ``literal(value)``,
``unbound(name, source)``, ``no shape``, ``no value`` and ``no dtype`` ``(tensor, source)`` (all raise), ``-x`` and
``not`` (one operand), ``+`` ``-`` ``*`` ``//`` ``%`` and the comparisons ``==`` ``!=`` ``<`` ``<=`` ``>`` ``>=``
``in`` ``not in`` (two), ``and``/``or`` (an iterable of values, consumed as far as they need: a chained comparison
is the ``and`` of its links), ``if(cond, then, else)`` (the branches as functions of no argument), ``[]``
(container, key), ``[:]`` (container, lower, upper, step), ``rank()``, ``dim()`` and ``shape()`` (a tensor's entry
in ``ShapeEnv.shapes`` first), ``value()`` and ``dtype()`` (a tensor's entry in ``ShapeEnv.values``, ``.dtypes``),
and the functions with ``()`` after their names (``len()``, ``sum()``, ``min()``, ...)."""


def _unbound(name: str, source: str) -> Any:
    raise ExprError(f"{source!r}: variable {name!r} is not bound")


def _no_shape(tensor: str, source: str) -> Any:
    raise ExprError(f"{source!r}: tensor {tensor!r} has no known shape")


def _no_value(tensor: str, source: str) -> Any:
    raise ExprError(f"{source!r}: tensor {tensor!r} has no known constant value")


def _no_dtype(tensor: str, source: str) -> Any:
    raise ExprError(f"{source!r}: tensor {tensor!r} has no known element type")


def _scalar_value(value: Any) -> float:
    """The float a one-element constant holds, as ONNX stores a float attribute (float32, the shortest decimal
    that round-trips it); ExprError for a constant of more elements or of another kind."""
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind != "f":
        raise ExprError(f"value() of a {array.dtype} constant of {array.size} elements, not one float")
    return float(str(np.float32(array.reshape(()))))


def _if(cond: Any, then: Callable[[], Any], otherwise: Callable[[], Any]) -> Any:
    return then() if cond else otherwise()


#: Evaluation on Python values: ints, bools, strings, tuples, and the dims of shapes (a dim over symbols is a
#: ``SymbolicDim`` whose comparisons are decided for every value of the symbols).
PYTHON_SEMANTICS: Semantics = {
    "literal": lambda value: value, "unbound": _unbound, "no shape": _no_shape, "no value": _no_value,
    "no dtype": _no_dtype,
    "-x": operator.neg, "not": operator.not_,
    "+": lambda a, b: _bounded(operator.add(a, b)), "-": operator.sub, "*": _mul, "//": operator.floordiv,
    "%": _mod,
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "in": lambda a, b: a in b, "not in": lambda a, b: a not in b,
    "and": all, "or": any, "if": _if,
    "[]": lambda container, key: container[key],
    "[:]": lambda container, lower, upper, step: container[slice(lower, upper, step)],
    "rank()": len, "dim()": lambda shape, i: shape[i], "shape()": tuple, "value()": _scalar_value,
    "dtype()": int,
    **{f"{name}()": fn for name, fn in zip(_PURE_FUNCS, (len, _sum, min, max, abs, all, any, tuple), strict=True)},
}


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
    def valued(self) -> frozenset[str]:
        """Pattern tensors whose constant values are read (``value(t)``)."""
        return frozenset(sub.args[0].id for sub in ast.walk(self.tree)  # type: ignore[attr-defined]
                         if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name)
                         and sub.func.id in _VALUE_FUNCS)

    @cached_property
    def _compiled(self) -> dict[int, Compiled]:
        """The expression compiled per semantics, by the semantics' id (they are module-level constants)."""
        return {}

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source}  # what is derived from it (a closure among them) is derived again

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "source", state["source"])

    def evaluate(self, env: ShapeEnv, semantics: Semantics = PYTHON_SEMANTICS) -> Any:
        """The value of the expression in ``env``, with the operations of ``semantics``."""
        compiled = self._compiled.get(id(semantics))
        if compiled is None:
            compiled = self._compiled[id(semantics)] = _compile(self.tree, self.source, semantics)
        return compiled(env)


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
            tensor_funcs = (*_SHAPE_FUNCS, *_VALUE_FUNCS, *_DTYPE_FUNCS)
            if not isinstance(sub.func, ast.Name) or sub.func.id not in (*_PURE_FUNCS, *tensor_funcs):
                raise ExprError(f"{source!r}: unknown function {ast.unparse(sub.func)}")
            if sub.func.id in tensor_funcs and (not sub.args or not isinstance(sub.args[0], ast.Name)):
                raise ExprError(f"{source!r}: {sub.func.id}() takes a pattern tensor name first")
            if sub.func.id in (*_VALUE_FUNCS, *_DTYPE_FUNCS) and len(sub.args) != 1:
                raise ExprError(f"{source!r}: {sub.func.id}() takes one pattern tensor")
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
                visit(arg, node.func.id in (*_SHAPE_FUNCS, *_VALUE_FUNCS, *_DTYPE_FUNCS) and k == 0)
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


def _compile(node: ast.AST, source: str, sem: Semantics) -> Compiled:
    """``node`` as a closure over an environment, its operations those of ``sem``: an expression is evaluated at
    every match and every numeric instance, and walking its tree each time was most of what evaluating it cost."""

    def sub(child: ast.AST) -> Compiled:
        return _compile(child, source, sem)

    match node:
        case ast.Constant(value=value):
            constant = sem["literal"]
            try:
                converted = constant(value)
            except Exception:  # a literal this semantics cannot express (z3: most strings) fails when evaluated
                return lambda env: constant(value)
            return lambda env: converted
        case ast.Name(id=name):
            unbound = sem["unbound"]

            def variable(env: ShapeEnv) -> Any:
                try:
                    return env.variables[name]
                except KeyError:
                    return unbound(name, source)
            return variable
        case ast.Tuple(elts=elts) | ast.List(elts=elts):
            parts = [sub(e) for e in elts]
            return lambda env: tuple(p(env) for p in parts)
        case ast.UnaryOp(op=op, operand=operand):
            fn, inner = sem["-x" if isinstance(op, ast.USub) else "not"], sub(operand)
            return lambda env: fn(inner(env))
        case ast.BinOp(left=left, op=op, right=right):
            fn, lhs, rhs = sem[_BINOPS[type(op)]], sub(left), sub(right)
            return lambda env: fn(lhs(env), rhs(env))
        case ast.BoolOp(op=op, values=values):
            fn, parts = sem["and" if isinstance(op, ast.And) else "or"], [sub(v) for v in values]
            return lambda env: fn(p(env) for p in parts)
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            first, both = sub(left), sem["and"]
            steps = [(sem[_CMPOPS[type(op)]], sub(right)) for op, right in zip(ops, comparators, strict=True)]

            def links(env: ShapeEnv) -> Iterator[Any]:
                current = first(env)
                for fn, right in steps:
                    value = right(env)
                    yield fn(current, value)
                    current = value
            return lambda env: both(links(env))
        case ast.IfExp(test=test, body=body, orelse=orelse):
            choose, cond, yes, no = sem["if"], sub(test), sub(body), sub(orelse)
            return lambda env: choose(cond(env), lambda: yes(env), lambda: no(env))
        case ast.Subscript(value=value, slice=index):
            container = sub(value)
            if isinstance(index, ast.Slice):
                cut = sem["[:]"]
                bounds = [None if p is None else sub(p) for p in (index.lower, index.upper, index.step)]
                return lambda env: cut(container(env), *(None if b is None else b(env) for b in bounds))
            at, key = sem["[]"], sub(index)
            return lambda env: at(container(env), key(env))
        case ast.Call(func=ast.Name(id=fname), args=args) if fname in _SHAPE_FUNCS:
            tensor, no_shape, fn = args[0].id, sem["no shape"], sem[f"{fname}()"]  # type: ignore[attr-defined]

            def shape_of(env: ShapeEnv) -> Any:
                try:
                    return env.shapes[tensor]
                except KeyError:
                    return no_shape(tensor, source)
            if fname != "dim":
                return lambda env: fn(shape_of(env))
            at = sub(args[1])
            return lambda env: fn(shape_of(env), at(env))
        case ast.Call(func=ast.Name(id=fname), args=args) if fname in (*_VALUE_FUNCS, *_DTYPE_FUNCS):
            # value(t) / dtype(t): what the environment knows of a constant input, or the semantics' "no value"
            field_name, missing = ("values", "no value") if fname in _VALUE_FUNCS else ("dtypes", "no dtype")
            tensor, absent, fn = args[0].id, sem[missing], sem[f"{fname}()"]  # type: ignore[attr-defined]

            def known(env: ShapeEnv) -> Any:
                table = getattr(env, field_name)
                if table is None or tensor not in table:
                    return absent(tensor, source)
                return fn(table[tensor])
            return known
        case ast.Call(func=ast.Name(id=fname), args=args):
            fn, parts = sem[f"{fname}()"], [sub(a) for a in args]
            return lambda env: fn(*(p(env) for p in parts))
    raise ExprError(f"{source!r}: cannot evaluate {ast.unparse(node)}")

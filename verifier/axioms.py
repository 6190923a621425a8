"""TASO-style axioms over the op table, each with a z3 formula and a numeric checker.

An axiom is written once as two terms of a tiny language and turned into both a universally
quantified z3 formula (``Axiom.formula``) and a concrete check (``Axiom.check``) that evaluates both
sides with the op table's float64 kernels on shapes and attributes drawn by the axiom's generator.

Terms: a tensor variable name (``str``); ``(op, attrs, *args)`` with ``op`` an op-table name, or
``"split:i"`` for output i of a split, or ``"rank"`` / ``"dim"`` for shape terms (``("dim", t, i)``).
Attribute values: literals, ``P(name)`` (an Int parameter, universally quantified), ``F(fn)`` with
``fn(env)`` computing a value from parameters and shapes, or tuples of those.

Axioms hold whenever both sides are well-formed (the op shape rules accept them) and the guard holds;
shape conditions are guards over ``rank``/``dim`` and the Int parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import z3
from xflow.verifier.encode import DIM, DTYPE, RANK, SCALAR_BITS, T, apply_op, float_bits, symbolic_code, z3_and, z3_max

from xflow.ops import OPS
from xflow.ops.attention import TO_HEADS, TO_HEADS_T

DOUBLE = onnx.TensorProto.DOUBLE  # constants are built in float64 for the checks


@dataclass(frozen=True)
class P:
    """An Int parameter of an axiom."""

    name: str


@dataclass(frozen=True)
class F:
    """An attribute value computed from parameters and shapes: ``fn(env)``."""

    fn: Callable[[Any], Any]


class NumEnv:
    """Evaluation environment for guards and ``F`` values on concrete arrays."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def p(self, name: str) -> Any:
        return self.values[name]

    def rank(self, t: str) -> int:
        return self.values[t].ndim

    def dim(self, t: str, i: Any) -> int:
        return self.values[t].shape[i]

    And = staticmethod(lambda *xs: all(xs))
    Not = staticmethod(lambda x: not x)
    If = staticmethod(lambda c, a, b: a if c else b)
    max = staticmethod(max)
    div = staticmethod(lambda a, b: a // b)
    code = staticmethod(lambda *entries: tuple(int(v) for v in entries))  # a shape attribute: the tuple itself

    def scalar(self, t: str) -> float:
        """The float value of a one-element tensor as a float attribute holds it (float32's shortest decimal)."""
        return float(str(np.float32(np.asarray(self.values[t]).reshape(()))))

    def scalar_is(self, t: str, value: float) -> bool:
        """Whether a one-element tensor holds ``value`` (as float32)."""
        return self.scalar(t) == float(str(np.float32(value)))

    def dtype(self, t: str) -> int:
        """A tensor's element type: float's where its float64 values are float32 numbers (what the check's float64
        stands for, as in the rules' check), else double's."""
        array = np.asarray(self.values[t])
        return onnx.TensorProto.FLOAT if np.array_equal(array.astype(np.float32), array) else DOUBLE

    def same_shape(self, a: Any, b: Any) -> bool:
        """Whether terms ``a`` and ``b`` have one shape (rank and every dim)."""
        return np.shape(_eval_num(a, self)) == np.shape(_eval_num(b, self))


class Z3Env:
    """Evaluation environment for guards and ``F`` values in z3."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def p(self, name: str) -> Any:
        return self.values[name]

    def rank(self, t: str) -> Any:
        return RANK(self.values[t])

    def dim(self, t: str, i: Any) -> Any:
        return DIM(self.values[t], i)

    And = staticmethod(z3_and)
    Not = staticmethod(z3.Not)
    If = staticmethod(z3.If)
    max = staticmethod(z3_max)
    div = staticmethod(lambda a, b: a / b)
    code = staticmethod(lambda *entries: symbolic_code(entries))  # a shape attribute of symbolic dims

    def scalar(self, t: str) -> Any:
        """The bits of a one-element tensor's float32 value (``value(t)`` of a rule: ``encode.SCALAR_BITS``)."""
        return SCALAR_BITS(self.values[t])

    def scalar_is(self, t: str, value: float) -> Any:
        """A one-element tensor holds ``value``: its bits are ``value``'s as float32."""
        return SCALAR_BITS(self.values[t]) == float_bits(value)

    def dtype(self, t: str) -> Any:
        """A tensor's element type (``dtype(t)`` of a rule: ``encode.DTYPE``)."""
        return DTYPE(self.values[t])

    def same_shape(self, a: Any, b: Any) -> Any:
        """Terms ``a`` and ``b`` have one shape: equal ranks and equal dims at every index (a quantified
        index, so the fact holds for tensors of any rank)."""
        ta, tb = _eval_z3(a, self), _eval_z3(b, self)
        i = z3.Int("same_shape_index")
        return z3.And(RANK(ta) == RANK(tb), z3.ForAll([i], DIM(ta, i) == DIM(tb, i)))


def _attr(value: Any, env: Any) -> Any:
    if isinstance(value, P):
        return env.p(value.name)
    if isinstance(value, F):
        return value.fn(env)
    if isinstance(value, tuple):
        return tuple(_attr(v, env) for v in value)
    return value


def _eval_num(term: Any, env: NumEnv) -> Any:
    if isinstance(term, F):
        return term.fn(env)
    if isinstance(term, str):
        return env.values[term]
    op, attrs, *args = term
    vals = [_eval_num(a, env) for a in args]
    if op == "rank":
        return vals[0].ndim
    if op == "dim":
        return vals[0].shape[_attr(attrs, env)]
    name, _, index = op.partition(":")
    entry = OPS[name]
    concrete = entry.normalize_attrs({k: _attr(v, env) for k, v in attrs.items()})
    entry.infer([v.shape for v in vals], concrete)  # raises ShapeError on an ill-formed instance
    outs = entry.evaluate(np, vals, concrete)
    return outs[int(index) if index else 0]


def _eval_z3(term: Any, env: Z3Env) -> Any:
    if isinstance(term, F):
        return term.fn(env)
    if isinstance(term, str):
        return env.values[term]
    op, attrs, *args = term
    vals = [_eval_z3(a, env) for a in args]
    if op == "rank":
        return RANK(vals[0])
    if op == "dim":
        return DIM(vals[0], _attr(attrs, env))
    name, _, index = op.partition(":")
    values = {k: _attr(v, env) for k, v in attrs.items()}
    n_out = len(values["split"]) if name == "split" else 1
    return apply_op(name, values, vals, n_out)[int(index) if index else 0]


def _plain(term: Any) -> bool:
    """True when a term holds no computed (``F``) attribute, so it can serve as a trigger pattern."""
    if isinstance(term, str):
        return True
    if isinstance(term, F):
        return False
    _, attrs, *args = term
    values = attrs.values() if isinstance(attrs, dict) else [attrs]

    def ok(v: Any) -> bool:
        return not isinstance(v, F) and (not isinstance(v, tuple) or all(ok(x) for x in v))

    return all(ok(v) for v in values) and all(_plain(a) for a in args)


def op_key(name: str, arity: int) -> str:
    """What relevance knows an application of op ``name`` to ``arity`` tensors by: the op-table name, and for a
    variadic op the arity too (``concat/1``). z3 has one function per arity, so an axiom about one-input concats
    can never fire on a rule's two-input ones, and in the rule's axiom set it would only move z3's search."""
    op = OPS.get(name)
    return f"{name}/{arity}" if op is not None and op.variadic else name


def _ops(term: Any) -> frozenset[str]:
    """The ops applied in ``term`` by ``op_key`` (the output index of a split dropped; ``rank``/``dim`` are shape
    functions every rule's hypotheses hold, not ops)."""
    if isinstance(term, str | F) or term is None:
        return frozenset()
    op, _, *args = term
    name = op.partition(":")[0]
    here = frozenset() if name in ("rank", "dim") else frozenset({op_key(name, len(args))})
    return here.union(*(_ops(a) for a in args))


def _names(term: Any, out: set[str]) -> set[str]:
    if isinstance(term, str):
        out.add(term)
        return out
    _, attrs, *args = term

    def visit(v: Any) -> None:
        if isinstance(v, P):
            out.add(v.name)
        elif isinstance(v, tuple):
            for x in v:
                visit(x)

    for v in (attrs.values() if isinstance(attrs, dict) else [attrs]):
        visit(v)
    for a in args:
        _names(a, out)
    return out


@dataclass(frozen=True)
class Axiom:
    """One universally quantified equation ``guard -> lhs == rhs`` with its numeric check."""

    name: str
    lhs: Any
    rhs: Any
    tensors: tuple[str, ...]
    params: tuple[str, ...]
    gen: Callable[[np.random.Generator], dict[str, Any]]
    guard: Callable[[Any], Any] | None = None
    doc: str = ""
    pattern: Any = None  # trigger term; default: lhs (and rhs) when usable
    shape: bool = field(default=False)  # an equation between Ints (rank/dim facts)
    #: Both sides together form one multi-pattern (the axiom relates two terms neither of which binds every
    #: variable alone); otherwise each pattern term is a trigger of its own.
    multi: bool = False
    #: The op-table names the axiom's two sides apply (derived from them).
    ops: frozenset[str] = field(init=False)
    #: Per trigger pattern of the formula, the ops a term must hold for E-matching to instantiate the axiom;
    #: without a usable pattern z3 picks its own from the body, so each op alone counts as a trigger.
    triggers: tuple[frozenset[str], ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", _ops(self.lhs) | _ops(self.rhs))
        terms = self._pattern_terms()
        patterns = (frozenset().union(*(_ops(t) for t in terms)),) if self.multi and terms else tuple(
            _ops(term) for term in terms)
        object.__setattr__(self, "triggers", patterns or tuple(frozenset({op}) for op in sorted(self.ops)))

    def _pattern_terms(self) -> list[Any]:
        """The terms of the formula's trigger patterns: plain terms that bind every variable."""
        everything = set(self.tensors) | set(self.params)
        candidates = [self.pattern] if self.pattern is not None else [self.lhs, self.rhs]
        if self.multi:
            plain = all(not isinstance(t, str | F) and _plain(t) for t in candidates)
            return candidates if plain and set().union(*(_names(t, set()) for t in candidates)) >= everything else []
        return [term for term in candidates
                if not isinstance(term, str | F) and _plain(term) and _names(term, set()) >= everything]

    def formula(self) -> z3.BoolRef:
        """The axiom as a z3 ForAll."""
        values: dict[str, Any] = {t: z3.Const(t, T) for t in self.tensors}
        values.update({p: z3.Int(p) for p in self.params})
        env = Z3Env(values)
        lhs, rhs = _eval_z3(self.lhs, env), _eval_z3(self.rhs, env)
        body: Any = lhs == rhs
        if self.guard is not None:
            g = self.guard(env)
            if g is not True:
                body = z3.Implies(g, body)
        bound = [values[n] for n in (*self.tensors, *self.params)]
        pats = [_eval_z3(term, env) for term in self._pattern_terms()]
        if self.multi and pats:
            pats = [z3.MultiPattern(*pats)]
        return z3.ForAll(bound, body, patterns=pats) if pats else z3.ForAll(bound, body)

    def check(self, rng: np.random.Generator) -> float:
        """Instantiate on random shapes; return the max abs difference (0 for exact shape facts)."""
        env = NumEnv(self.gen(rng))
        if self.guard is not None and not self.guard(env):
            raise AssertionError(f"{self.name}: generator broke the guard")
        lhs, rhs = _eval_num(self.lhs, env), _eval_num(self.rhs, env)
        if self.shape:
            return 0.0 if lhs == rhs else float("inf")
        lhs, rhs = np.asarray(lhs), np.asarray(rhs)
        if lhs.shape != rhs.shape:
            return float("inf")
        return float(np.max(np.abs(lhs - rhs))) if lhs.size else 0.0

    def check_perturbed(self, rng: np.random.Generator) -> float | None:
        """Instantiate off the generator's pattern: its draw with the shapes of one or two tensors moved toward
        broadcasting (dims set to 1, leading dims dropped or added, other sizes or ranks, another operand's
        shape, or the two trading shapes), and half the time one Int parameter redrawn. Return the max abs
        difference where the guard holds and both sides are well formed (inf for sides of other shapes), None
        otherwise. The generators draw what the author had in mind; a missing guard shows on the instances
        they never make (operands that broadcast)."""
        values = self.gen(rng)
        arrays = [name for name in self.tensors if isinstance(values.get(name), np.ndarray)]
        moved = [arrays[int(i)] for i in rng.permutation(len(arrays))[:int(rng.integers(1, 3))]]
        shapes = {name: values[name].shape for name in arrays}
        swap = len(moved) == 2 and rng.random() < 0.25  # two operands trade shapes (pieces of other lengths)
        for k, name in enumerate(moved):  # one or two operands: more are seldom well formed
            array = values[name]
            low = 0.05 if array.size and np.all(array >= 0) else -1.0  # keep a positive operand positive
            shape = (shapes[moved[1 - k]] if swap
                     else shapes[arrays[int(rng.integers(len(arrays)))]] if rng.random() < 0.25  # another's
                     else _perturbed_shape(rng, array.shape))
            values[name] = rng.uniform(low, 1.0, size=shape)
        ints = [name for name in self.params
                if isinstance(values.get(name), int | np.integer) and not isinstance(values[name], bool)]
        if ints and rng.random() < 0.5:
            values[ints[int(rng.integers(len(ints)))]] = int(rng.integers(-2, 8))
        env = NumEnv(values)
        try:
            if self.guard is not None and not self.guard(env):
                return None
            lhs, rhs = _eval_num(self.lhs, env), _eval_num(self.rhs, env)
        except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError):  # ShapeError is a ValueError
            return None  # ill formed: no claim there
        if self.shape:
            return 0.0 if lhs == rhs else float("inf")
        lhs, rhs = np.asarray(lhs), np.asarray(rhs)
        if lhs.shape != rhs.shape:
            return float("inf")
        if not lhs.size or not np.all(np.isfinite(lhs)):
            return None
        return float(np.max(np.abs(lhs - rhs)))


def _perturbed_shape(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` moved toward broadcasting or elsewhere: some dims 1, leading dims dropped or added, fresh."""
    kind, dims = int(rng.integers(5)), list(shape)
    if kind == 0:
        dims = [1 if rng.random() < 0.5 else d for d in dims]
    elif kind == 1 and dims:
        dims = dims[int(rng.integers(1, len(dims) + 1)):]
    elif kind == 2:
        dims = [int(d) for d in rng.integers(1, 3, size=int(rng.integers(1, 3)))] + dims
    elif kind == 3:
        dims = [int(d) for d in rng.integers(1, 6, size=int(rng.integers(0, 5)))]
    else:
        dims = [int(d) for d in rng.integers(1, 7, size=len(dims))]
    return tuple(dims)


# ---- generators --------------------------------------------------------------------------------


def _arr(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=shape)


def _pick(rng: np.random.Generator, seq: Any) -> Any:
    return seq[int(rng.integers(len(seq)))]


def _same(names: str, rank: tuple[int, ...] = (1, 2, 3)) -> Callable[[np.random.Generator], dict[str, Any]]:
    def gen(rng):
        shape = tuple(int(d) for d in rng.integers(1, 4, size=_pick(rng, rank)))
        return {n: _arr(rng, *shape) for n in names.split()}
    return gen


def _scalar(rng):
    return _arr(rng, *_pick(rng, [(), (1,)]))


def _conv_params(rng, k=(1, 3)) -> dict[str, Any]:
    kh, kw = _pick(rng, k), _pick(rng, k)
    return {"sh": _pick(rng, [1, 2]), "sw": _pick(rng, [1, 2]), "pt": int(rng.integers(0, 2)),
            "pl": int(rng.integers(0, 2)), "pb": int(rng.integers(0, 2)), "pr": int(rng.integers(0, 2)),
            "kh": kh, "kw": kw}


def _conv_shapes(rng, group_choices=(1, 2)) -> dict[str, Any]:
    d = _conv_params(rng)
    g = _pick(rng, group_choices)
    n, cin, m = _pick(rng, [1, 2]), g * _pick(rng, [1, 2]), g * _pick(rng, [1, 2])
    d.update(g=g, act=_pick(rng, ["none", "relu"]), n=n, cin=cin, m=m, h=int(rng.integers(3, 6)),
             w_=int(rng.integers(3, 6)))
    return d


STRIDES = (P("sh"), P("sw"))
ONE = (1, 1)
#: A conv's or pool's pads with other end pads ``qb``, ``qr`` (bottom, right).
END_PADS = (P("pt"), P("pl"), P("qb"), P("qr"))
PADS = (P("pt"), P("pl"), P("pb"), P("pr"))
CONV_PARAMS = ("sh", "sw", "pt", "pl", "pb", "pr", "g")


def _conv(act: Any = P("act"), group: Any = P("g"), pads: Any = PADS, strides: Any = STRIDES) -> dict[str, Any]:
    return {"strides": strides, "pads": pads, "group": group, "act": act}


def _conv_gen(extra: Callable[[np.random.Generator, dict[str, Any]], dict[str, Any]], group_choices=(1, 2)):
    def gen(rng):
        d = _conv_shapes(rng, group_choices)
        d.update(extra(rng, d))
        return d
    return gen


def _img(rng, d, c=None):
    return _arr(rng, d["n"], d["cin"] if c is None else c, d["h"], d["w_"])


def _ker(rng, d, m=None, c=None):
    return _arr(rng, d["m"] if m is None else m, (d["cin"] // d["g"]) if c is None else c, d["kh"], d["kw"])


def _end_pads_gen(rng: np.random.Generator) -> dict[str, Any]:
    """A conv instance and other end pads ``qb``, ``qr`` that give the output the same size (stride 2 mostly:
    there an end pad of one more or less often leaves the size alone)."""
    d = _conv_shapes(rng)
    d.update(sh=_pick(rng, [2, 2, 1]), sw=_pick(rng, [2, 2, 1]))
    d.update(x=_img(rng, d), w=_ker(rng, d))
    return _other_end_pads(rng, d, d["h"], d["w_"], (3, 3))


def _biased_end_pads_gen(rng: np.random.Generator) -> dict[str, Any]:
    """``_end_pads_gen`` with a bias ``b`` for the kernel."""
    d = _end_pads_gen(rng)
    return {**d, "b": _vec(rng, d["w"].shape[0])}


def _other_end_pads(rng: np.random.Generator, d: dict[str, Any], h: int, w: int,
                    below: tuple[int, int]) -> dict[str, Any]:
    """``d`` with end pads ``qb``, ``qr`` (below ``below``, per axis) that give a window of ``kh`` x ``kw`` at strides
    ``sh``, ``sw`` over an ``h`` x ``w`` image as many positions as ``pb``, ``pr`` do."""
    def other(size: int, start: int, end: int, k: int, s: int, limit: int) -> int:
        out = (size + start + end - k) // s
        return _pick(rng, [q for q in range(limit) if size + start + q >= k and (size + start + q - k) // s == out])

    return {**d, "qb": other(h, d["pt"], d["pb"], d["kh"], d["sh"], below[0]),
            "qr": other(w, d["pl"], d["pr"], d["kw"], d["sw"], below[1])}


def _pads_gen(names: str) -> Callable[[np.random.Generator], dict[str, Any]]:
    """Images of one shape and a pad's pads (its height and width only, 0 to 2 at each end)."""
    def gen(rng):
        d = _same(names, (4,))(rng)
        t, left, b, r = (int(v) for v in rng.integers(0, 3, size=4))
        return {**d, "pp": (0, 0, t, left, 0, 0, b, r)}
    return gen


def _pool_end_pads_gen(rng: np.random.Generator) -> dict[str, Any]:
    """A pooling instance and other end pads ``qb``, ``qr`` (below the kernel) that give the output the same size."""
    d = _pool_gen(rng)
    d.update(sh=_pick(rng, [2, 2, 1]), sw=_pick(rng, [2, 2, 1]))
    # pooling pads stay below the kernel (ONNX)
    return _other_end_pads(rng, d, d["x"].shape[2], d["x"].shape[3], (d["kh"], d["kw"]))


def _unit_gen(rng: np.random.Generator) -> dict[str, Any]:
    """A matrix (or batch of them) ``x`` with the shape of a tensor of ones over it and its identity sizes."""
    x = _arr(rng, *(int(d) for d in rng.integers(1, 4, size=_pick(rng, [2, 2, 3]))))
    n, m = x.shape[-2], x.shape[-1]
    ones = _pick(rng, [x.shape, x.shape[1:], (1,) * x.ndim, (m,)])
    return {"x": x, "shp": tuple(int(d) for d in ones), "n": n, "m": m, "dt": DOUBLE}


def _mat_gen(spec: str) -> Callable[[np.random.Generator], dict[str, Any]]:
    """Matrices from a spec like 'x:ab y:bc z:cd' with random sizes per letter (and s: scalars)."""
    def gen(rng):
        sizes = {ch: int(rng.integers(1, 4)) for ch in "abcdefgh"}
        out: dict[str, Any] = {}
        for item in spec.split():
            name, dims = item.split(":")
            out[name] = _scalar(rng) if dims == "s" else _arr(rng, *(sizes[c] for c in dims))
        return out
    return gen


def _concat_gen(names: str, rank=(1, 2, 3), vary=True, scalar: str = ""):
    """Tensors that agree except on a random axis ``ax`` (params ax, and axes of their shapes)."""
    def gen(rng):
        r = _pick(rng, rank)
        base = [int(d) for d in rng.integers(1, 4, size=r)]
        ax = int(rng.integers(r))
        out: dict[str, Any] = {"ax": ax}
        for n in names.split():
            shape = list(base)
            if vary:
                shape[ax] = int(rng.integers(1, 4))
            out[n] = _arr(rng, *shape)
        if scalar:
            out[scalar] = _scalar(rng)
        return out
    return gen


def _split_gen(rng):
    r = _pick(rng, (1, 2, 3))
    shape = [int(d) for d in rng.integers(1, 4, size=r)]
    ax = int(rng.integers(r))
    shape[ax] = int(rng.integers(2, 6))
    s1 = int(rng.integers(0, shape[ax] + 1))
    return {"x": _arr(rng, *shape), "ax": ax, "s1": s1, "s2": shape[ax] - s1}


def _split_matmul_gen(rows: bool) -> Callable[[np.random.Generator], dict[str, Any]]:
    """Matrices ``x`` (n x k) and ``y`` (k x m) and a 2-way split of the product's rows (or columns)."""
    def gen(rng):
        n, k, m = (int(v) for v in rng.integers(1, 5, size=3))
        whole = n if rows else m
        s1 = int(rng.integers(0, whole + 1))
        return {"x": _arr(rng, n, k), "y": _arr(rng, k, m), "ax": 0 if rows else 1, "s1": s1, "s2": whole - s1}
    return gen


def _split_concat_gen(rng):
    d = _concat_gen("a b")(rng)
    d["s1"], d["s2"] = d["a"].shape[d["ax"]], d["b"].shape[d["ax"]]
    return d


def _geometry_gen(rng):
    r = _pick(rng, (2, 3))
    ax1, ax2 = (int(v) for v in rng.choice(r, size=2, replace=False))
    base = [int(d) for d in rng.integers(1, 4, size=r)]
    u1, u2, v1, v2 = (int(d) for d in rng.integers(1, 4, size=4))

    def shape(i, j):
        s = list(base)
        s[ax1], s[ax2] = i, j
        return s

    return {"ax1": ax1, "ax2": ax2, "a": _arr(rng, *shape(u1, v1)), "b": _arr(rng, *shape(u1, v2)),
            "c": _arr(rng, *shape(u2, v1)), "d": _arr(rng, *shape(u2, v2))}


def _batched_mm_gen(rng):
    rx, ry = _pick(rng, [2, 3]), _pick(rng, [2, 3])
    batch = [2] * (max(rx, ry) - 2)
    n, k, m1, m2 = (int(v) for v in rng.integers(1, 4, size=4))
    return {"x": _arr(rng, *batch[:rx - 2], n, k), "y": _arr(rng, *batch[:ry - 2], k, m1),
            "z": _arr(rng, *batch[:ry - 2], k, m2), "ax": ry - 1}


def _batched_mm_rows_gen(rng):
    rx, ry = _pick(rng, [2, 3]), _pick(rng, [2, 3])
    batch = [2] * (max(rx, ry) - 2)
    n1, n2, k, m = (int(v) for v in rng.integers(1, 4, size=4))
    return {"x": _arr(rng, *batch[:rx - 2], n1, k), "z": _arr(rng, *batch[:rx - 2], n2, k),
            "y": _arr(rng, *batch[:ry - 2], k, m), "ax": rx - 2}


def _broadcast_gen(rng: np.random.Generator) -> dict[str, Any]:
    """``x`` of rank 1 to 3 and ``y`` that broadcasts with it: a suffix of x's shape with some dims 1, either
    way round."""
    shape = [int(d) for d in rng.integers(1, 4, size=_pick(rng, (1, 2, 3)))]
    suffix = [1 if rng.random() < 0.3 else d for d in shape[int(rng.integers(len(shape))):]]
    x, y = _arr(rng, *shape), _arr(rng, *suffix)
    return {"x": x, "y": y} if rng.random() < 0.5 else {"x": y, "y": x}


def _column_scale_gen(rng: np.random.Generator) -> dict[str, Any]:
    """``x`` of rank 2 or 3 (n, k), a weight ``w`` (k, m) and a per-column scale ``g`` (m, or 1 to broadcast;
    with m = 1 a longer g broadcasts the product instead, which the identity covers too)."""
    n, k, m = (int(v) for v in rng.integers(1, 4, size=3))
    batch = [2] * (_pick(rng, (2, 3)) - 2)
    g = _pick(rng, (m, 1)) if m > 1 else int(rng.integers(1, 4))
    return {"x": _arr(rng, *batch, n, k), "w": _arr(rng, k, m), "g": _arr(rng, g)}


def _lead_broadcast_gen(rng: np.random.Generator) -> dict[str, Any]:
    """``x`` of rank 2 to 4 and ``y`` of lower rank that broadcasts with it: a proper suffix of x's shape
    with some dims 1."""
    shape = [int(d) for d in rng.integers(1, 4, size=_pick(rng, (2, 3, 4)))]
    suffix = [1 if rng.random() < 0.3 else d for d in shape[int(rng.integers(1, len(shape))):]]
    return {"x": _arr(rng, *shape), "y": _arr(rng, *suffix)}


def _pool_gen(rng, cip=None):
    kh, kw = _pick(rng, [1, 2, 3]), _pick(rng, [1, 2, 3])
    d = {"kh": kh, "kw": kw, "sh": _pick(rng, [1, 2]), "sw": _pick(rng, [1, 2]),
         "pt": int(rng.integers(0, kh)), "pl": int(rng.integers(0, kw)), "pb": int(rng.integers(0, kh)),
         "pr": int(rng.integers(0, kw)), "cip": _pick(rng, [0, 1]) if cip is None else cip}
    n, h, w = _pick(rng, [1, 2]), int(rng.integers(3, 6)), int(rng.integers(3, 6))
    ca, cb = _pick(rng, [1, 2]), _pick(rng, [1, 2])
    d.update(x=_arr(rng, n, ca, h, w), y=_arr(rng, n, ca, h, w), b=_arr(rng, n, cb, h, w))
    return d


POOL = {"kernel": (P("kh"), P("kw")), "strides": STRIDES, "pads": PADS}
AVG = {**POOL, "count_include_pad": P("cip")}
POOL_PARAMS = ("kh", "kw", "sh", "sw", "pt", "pl", "pb", "pr")
T10 = {"perm": (1, 0)}


def _t(x: Any) -> Any:
    return ("transpose", T10, x)


def _same_image(e: Any) -> Any:
    """x and y are images of one shape (rank 4, every dim equal): finite, so a rule's where clauses can state it."""
    return e.And(e.rank("x") == 4, e.rank("y") == 4, *(e.dim("x", i) == e.dim("y", i) for i in range(4)))


def _add(a: Any, b: Any) -> Any:
    return ("add", {}, a, b)


def _mul(a: Any, b: Any) -> Any:
    return ("mul", {}, a, b)


def _sub(a: Any, b: Any) -> Any:
    return ("sub", {}, a, b)


def _smul(a: Any, b: Any) -> Any:
    return ("smul", {}, a, b)


def _mm(a: Any, b: Any) -> Any:
    return ("matmul", {}, a, b)


def _pow2(exponent: Any, x: Any) -> Any:
    return ("pow2_scale", {"exponent": exponent}, x)


#: exponents of 2 the pow2_scale axioms are checked at (2**64 lifts every float32 denormal well into the normals)
POW2_EXPONENTS = (-64, -3, 0, 1, 5, 64)


def _pow2_mm_gen(rng):
    d = _batched_mm_gen(rng)
    return {"x": d["x"], "y": d["y"], "k": _pick(rng, POW2_EXPONENTS)}


def _pow2_gen(rng):
    return {**_same("x")(rng), "a": _pick(rng, POW2_EXPONENTS), "b": _pick(rng, POW2_EXPONENTS)}


def _cat(ax: Any, a: Any, b: Any) -> Any:
    return ("concat", {"axis": ax}, a, b)


def _split(i: int, x: Any, ax: Any = P("ax"), sizes: Any = (P("s1"), P("s2"))) -> Any:
    return (f"split:{i}", {"axis": ax, "split": sizes}, x)


def _relu(a: Any) -> Any:
    return ("relu", {}, a)


def _div(a: Any, b: Any) -> Any:
    return ("div", {}, a, b)


def _pad(x: Any, spatial: tuple[int, int, int, int], value: float = 0.0) -> Any:
    """Constant padding of an NCHW tensor's height and width by (top, left, bottom, right)."""
    top, left, bottom, right = spatial
    return ("pad", {"pads": (0, 0, top, left, 0, 0, bottom, right), "value": value}, x)


#: The spatial paddings (top, left, bottom, right) that pad-into-conv axioms state.
PAD_INTO_CONV: tuple[tuple[int, int, int, int], ...] = ((1, 1, 1, 1), (0, 0, 1, 1), (1, 1, 2, 2))


def _un(op: str, a: Any) -> Any:
    """An attribute-free one-input op applied to ``a``."""
    return (op, {}, a)


def _where(c: Any, a: Any, b: Any) -> Any:
    return ("where", {}, c, a, b)


#: one-input element-wise ops without attributes, which commute with layout ops (transpose, concat)
UNARY = ("neg", "reciprocal", "sqrt", "exp", "erf", "hardswish")
FIRST_AXIS = {"axes": (0,), "keepdims": 1}


def _masked(names: str) -> Callable[[np.random.Generator], dict[str, Any]]:
    """Same-shape tensors and a bool mask ``c`` of their shape."""
    def gen(rng):
        out = _same(names)(rng)
        out["c"] = rng.random(out[names.split()[0]].shape) < 0.5
        return out
    return gen


def _positive(gen: Callable[[np.random.Generator], dict[str, Any]]) -> Callable[[np.random.Generator], dict[str, Any]]:
    """``gen`` with its arrays made positive (sqrt and reciprocal stay real and finite)."""
    def positive(rng):
        return {k: np.abs(v) + 0.1 if isinstance(v, np.ndarray) else v for k, v in gen(rng).items()}
    return positive


#: The depthwise averaging kernel (c, 1, kh, kw).
CPOOL = ("const_pool", {"shape": (P("c"), 1, P("kh"), P("kw")), "dtype": P("dt")})
#: A tensor of ones of the shape coded in parameter ``shp``.
ONES = ("const_ones", {"shape": P("shp"), "dtype": P("dt")})


def _eye(size: str) -> Any:
    """The identity matrix of parameter ``size``'s size."""
    return ("const_imatmul", {"shape": (P(size), P(size)), "dtype": P("dt")})


def _cv(x: Any, w: Any, *bias: Any, **kw: Any) -> Any:
    return ("conv", _conv(**kw), x, w, *bias)


def _cvb(x: Any, w: Any, b: Any, **kw: Any) -> Any:
    return ("conv", _conv(**kw), x, w, b)


def _bn(x: Any, s: Any, t: Any, m: Any, v: Any) -> Any:
    return ("batchnorm", {"epsilon": P("eps")}, x, s, t, m, v)


def _vec(rng: np.random.Generator, n: int, positive: bool = False) -> np.ndarray:
    return rng.uniform(0.5, 1.5, size=n) if positive else _arr(rng, n)


def _biased_gen(group_choices=(1, 2), second: bool = False, other_image: bool = False):
    """A conv instance with a bias ``b`` (and a second kernel ``v`` with bias ``c``, or a second image ``y``)."""
    def extra(rng, d):
        w = _ker(rng, d)
        out = {"x": _img(rng, d), "w": w, "b": _vec(rng, w.shape[0])}
        if second:
            v = _ker(rng, d, m=_pick(rng, [1, 3]))
            out.update(v=v, c=_vec(rng, v.shape[0]))
        if other_image:
            out["y"] = _arr(rng, 3, d["cin"], d["h"], d["w_"])
        return out
    return _conv_gen(extra, group_choices)


def _pointwise_after_gen(inner: str) -> Callable[[np.random.Generator], dict[str, Any]]:
    """An ``inner`` instance ("conv", "conv_bias" or a pool) over an image ``x`` at strides ``sh``, ``sw``, and a
    1x1 unpadded conv ``u`` (group ``g2``, act ``act2``, bias ``c``) over its output: the instance of the
    stride-hoisting axioms."""
    def gen(rng):
        if inner.startswith("conv"):
            d = _conv_shapes(rng)
            d.update(x=_img(rng, d), w=_ker(rng, d))
            d["b"] = _vec(rng, d["w"].shape[0])
            channels = d["m"]
        else:
            d = _pool_gen(rng)
            channels = d["x"].shape[1]
        g2 = _pick(rng, [1, channels])
        m2 = g2 * _pick(rng, [1, 2])
        d.update(g2=g2, act2=_pick(rng, ["none", "relu"]), u=_arr(rng, m2, channels // g2, 1, 1),
                 c=_vec(rng, m2))
        return d
    return gen


def _bn_params(rng, c: int, suffix: str = "") -> dict[str, Any]:
    return {f"s{suffix}": _vec(rng, c), f"t{suffix}": _vec(rng, c), f"m{suffix}": _vec(rng, c),
            f"v{suffix}": _vec(rng, c, positive=True)}


def _bn_gen(channels: bool):
    """Two activations ``a``, ``c`` that concatenate on axis 1 (``channels``) or 0, with BN parameters."""
    def gen(rng):
        rest = [int(d) for d in rng.integers(1, 4, size=_pick(rng, [0, 1, 2]))]
        n, ca = _pick(rng, [1, 2]), _pick(rng, [1, 2, 3])
        cc, nc = (_pick(rng, [1, 2, 3]), n) if channels else (ca, _pick(rng, [1, 2]))
        d = {"a": _arr(rng, n, ca, *rest), "c": _arr(rng, nc, cc, *rest), "eps": _pick(rng, [1e-5, 1e-3])}
        d.update(_bn_params(rng, ca))
        if channels:
            d.update(_bn_params(rng, cc, "2"))
        return d
    return gen


BN_PARAMS = ("s", "t", "m", "v")


def _enlarged(w: Any) -> Any:
    """Kernel ``w`` zero-padded, centered, to ``eh`` x ``ew``."""
    return ("enlarge", {"size": (P("eh"), P("ew"))}, w)


def _iconv_kernel() -> Any:
    """The identity conv kernel of ``c`` channels and size ``kh`` x ``kw``."""
    return ("const_iconv", {"shape": (P("c"), P("c"), P("kh"), P("kw")), "dtype": P("dt")})


def _iconv_gen(rng: np.random.Generator) -> dict[str, Any]:
    return {"c": _pick(rng, [1, 2, 3]), "kh": _pick(rng, [1, 2, 3]), "kw": _pick(rng, [1, 3]), "dt": DOUBLE}


def _skip_gen(params: tuple[str, ...]) -> Callable[[np.random.Generator], dict[str, Any]]:
    """An input x and a residual s of one shape (rank 2 or 3), vectors of its last dim, an epsilon."""
    def gen(rng):
        shape = tuple(int(d) for d in rng.integers(1, 5, size=_pick(rng, [2, 3])))
        d = {"x": _arr(rng, *shape), "s": _arr(rng, *shape), "eps": _pick(rng, [1e-12, 1e-5])}
        d.update({p: _arr(rng, shape[-1]) for p in params})
        return d
    return gen


def _rotary_rows(cache: Any, positions: Any) -> Any:
    """A rotary cache's rows at the positions, repeated across the head and unsqueezed over the heads: (B, 1, S, D)."""
    return ("unsqueeze", {"axes": (1,)}, ("gather", {"axis": 0}, ("concat", {"axis": 1}, cache, cache), positions))


def _rotate_half(x: Any, cos: Any, sin: Any) -> Any:
    """x · cos + concat(-x₂, x₁) · sin over the last axis of a rank-4 x (Llama's rotate_half)."""
    dims = lambda e: (e.dim(x, 0), e.dim(x, 1), e.dim(x, 2))  # noqa: E731
    first = ("slice", {"starts": (0, 0, 0, 0), "steps": (1, 1, 1, 1),
                       "stops": F(lambda e: e.code(*dims(e), e.div(e.dim(x, 3), 2)))}, x)
    second = ("slice", {"starts": F(lambda e: e.code(0, 0, 0, e.div(e.dim(x, 3), 2))), "steps": (1, 1, 1, 1),
                        "stops": F(lambda e: e.code(*dims(e), e.dim(x, 3)))}, x)
    return _add(_mul(x, cos), _mul(("concat", {"axis": 3}, _un("neg", second), first), sin))


def _rotary_gen(rng):
    """x (B, N, S, D), position ids (B, S) among M cache rows of width D / 2."""
    b, n, s, half = (int(d) for d in rng.integers(1, 4, size=4))
    m = int(rng.integers(s, 2 * s + 2))
    return {"x": _arr(rng, b, n, s, 2 * half), "p": rng.integers(0, m, size=(b, s)), "c": _arr(rng, m, half),
            "s": _arr(rng, m, half)}


def _cast_gen(rng):
    """x and the type it has: float32 numbers and float, or float64 ones and double."""
    x = _same("x")(rng)["x"]
    if rng.random() < 0.5:
        return {"x": x.astype(np.float32).astype(np.float64), "t": onnx.TensorProto.FLOAT}
    return {"x": x, "t": DOUBLE}


def _rms_gen(rng):
    """x of rank 2 or 3, a scale g of its last dim, a positive epsilon e of rank 0 and the parameters it fixes."""
    shape = tuple(int(d) for d in rng.integers(1, 5, size=_pick(rng, [2, 3])))
    eps = _pick(rng, [1e-5, 1e-6, 0.25])
    return {"x": _arr(rng, *shape), "g": _arr(rng, shape[-1]), "e": np.array(eps), "eps": eps,
            "a": len(shape) - 1, "ax": (len(shape) - 1,)}


def _bias_gen(rng):
    shape = tuple(int(d) for d in rng.integers(1, 4, size=_pick(rng, [1, 2, 3])))
    return {"x": _arr(rng, *shape), "b": _arr(rng, shape[-1])}


def _swap_t(rank: int, x: Any) -> Any:
    """x of ``rank`` dims with its last two swapped."""
    return ("transpose", {"perm": (*range(rank - 2), rank - 1, rank - 2)}, x)


def _fmm(trans_a: int, trans_b: int, a: Any, b: Any) -> Any:
    return ("fused_matmul", {"alpha": 1.0, "transA": trans_a, "transB": trans_b}, a, b)


def _fmm_gen(rank: int, trans_b: bool) -> Callable[[np.random.Generator], dict[str, Any]]:
    """Operands of a matmul with one of them (y for ``trans_b``, else x) of ``rank`` and stored transposed."""
    def gen(rng):
        m, k, n = (int(v) for v in rng.integers(1, 4, size=3))
        batch = tuple(int(v) for v in rng.integers(1, 3, size=rank - 2))
        other = _pick(rng, [(), batch[-1:], batch])
        if trans_b:
            return {"x": _arr(rng, *other, m, k), "y": _arr(rng, *batch, n, k)}
        return {"x": _arr(rng, *batch, k, m), "y": _arr(rng, *other, k, n)}
    return gen


def _tag(spatial: tuple[int, ...]) -> str:
    return "_".join(map(str, spatial))


def _grown(spatial: tuple[int, int, int, int]) -> tuple[F, F, F, F]:
    """A window op's pads ``PADS`` grown by an explicit pad's ``spatial`` (top, left, bottom, right)."""
    return tuple(F(lambda e, n=n, s=s: e.p(n) + s) for n, s in zip(("pt", "pl", "pb", "pr"), spatial, strict=True))


def _pads_nonneg(e: Any) -> Any:
    return e.And(e.p("pt") >= 0, e.p("pl") >= 0, e.p("pb") >= 0, e.p("pr") >= 0)


def _pool_pad_gen(spatial: tuple[int, int, int, int]) -> Callable[[np.random.Generator], dict[str, Any]]:
    """An average pooling instance whose pads grown by ``spatial`` stay below its kernel (ONNX)."""
    top, left, bottom, right = spatial

    def gen(rng):
        kh, kw = _pick(rng, [3, 4, 5]), _pick(rng, [3, 4, 5])
        d = {"kh": kh, "kw": kw, "sh": _pick(rng, [1, 2]), "sw": _pick(rng, [1, 2]),
             "pt": int(rng.integers(0, kh - top)), "pl": int(rng.integers(0, kw - left)),
             "pb": int(rng.integers(0, kh - bottom)), "pr": int(rng.integers(0, kw - right))}
        d["x"] = _arr(rng, _pick(rng, [1, 2]), _pick(rng, [1, 2]), kh + int(rng.integers(0, 3)),
                      kw + int(rng.integers(0, 3)))
        return d
    return gen


def _pad_concat_gen(rng: np.random.Generator) -> dict[str, Any]:
    """Two NCHW tensors that concatenate on axis 0 or 1."""
    ax = _pick(rng, [0, 1])
    base = [int(d) for d in rng.integers(1, 4, size=4)]
    shapes = [list(base), list(base)]
    shapes[1][ax] = int(rng.integers(1, 4))
    return {"ax": ax, "a": _arr(rng, *shapes[0]), "b": _arr(rng, *shapes[1])}


def _pool_concat_gen(rng: np.random.Generator) -> dict[str, Any]:
    """A pooling instance with images ``x``, ``b`` that concatenate on axis ``ax`` (0 or 1)."""
    d = _pool_gen(rng)
    d["ax"] = _pick(rng, [0, 1])
    if d["ax"] == 0:
        n, c, h, w = d["x"].shape
        d["b"] = _arr(rng, 3 - n, c, h, w)
    return d


def _iconv_strided_gen(rng: np.random.Generator) -> dict[str, Any]:
    """An identity kernel, its centered pads (end pads sometimes beyond them), strides and an image of its channels."""
    d = _iconv_gen(rng)
    kh, kw = d["kh"], d["kw"]
    d.update(sh=_pick(rng, [1, 2]), sw=_pick(rng, [1, 2]), pt=kh // 2, pl=kw // 2,
             pb=kh - 1 - kh // 2 + _pick(rng, [0, 0, 1, 2]), pr=kw - 1 - kw // 2 + _pick(rng, [0, 0, 1, 2]))
    d["x"] = _arr(rng, _pick(rng, [1, 2]), d["c"], int(rng.integers(3, 7)), int(rng.integers(3, 7)))
    return d


def _heads(t: str, perm: tuple[int, ...]) -> Any:
    """(B, T, H·D) -> (B, T, H, D), its axes permuted: the heads split from the last dim, H the parameter h."""
    split = F(lambda e: e.code(e.dim(t, 0), e.dim(t, 1), e.p("h"), e.div(e.dim(t, 2), e.p("h"))))
    return ("transpose", {"perm": perm}, ("reshape", {"shape": split}, t))


def _attention_core(context_reshaped: bool) -> Any:
    """softmax(Q Kᵀ) V per head of q, k, v (B, S, H·D), (B, L, H·D), (B, L, H·Dv), heads merged back: what
    MultiHeadAttention with scale 1 computes, written as transformers' exports write it (with
    ``context_reshaped``, the context first reshaped to the (B, H, S, Dv) it already has, as theirs do)."""
    probs = ("softmax", {"axis": 3}, _mm(_heads("q", TO_HEADS), _heads("k", TO_HEADS_T)))
    context = _mm(probs, _heads("v", TO_HEADS))
    if context_reshaped:
        same = F(lambda e: e.code(e.dim("q", 0), e.p("h"), e.dim("q", 1), e.div(e.dim("v", 2), e.p("h"))))
        context = ("reshape", {"shape": same}, context)
    merged = F(lambda e: e.code(e.dim("q", 0), e.dim("q", 1), e.dim("v", 2)))
    return ("reshape", {"shape": merged}, ("transpose", {"perm": TO_HEADS}, context))


def _attention_gen(rng: np.random.Generator) -> dict[str, Any]:
    """Query (B, S, H·D), key (B, L, H·D), value (B, L, H·Dv) and the heads H."""
    batch, heads = _pick(rng, [1, 2]), _pick(rng, [1, 2, 3])
    seq, length, d, dv = (int(n) for n in rng.integers(1, 5, size=4))
    return {"q": _arr(rng, batch, seq, heads * d), "k": _arr(rng, batch, length, heads * d),
            "v": _arr(rng, batch, length, heads * dv), "h": heads}


def _permuted_gen(rng: np.random.Generator) -> dict[str, Any]:
    """x of rank 1 to 4, a permutation of its axes, a scalar s."""
    x = _arr(rng, *(int(d) for d in rng.integers(1, 4, size=_pick(rng, [1, 2, 3, 4]))))
    return {"x": x, "s": _scalar(rng), "perm": tuple(int(i) for i in rng.permutation(x.ndim))}


def _reshaped_gen(rng: np.random.Generator) -> dict[str, Any]:
    """x, a target shape of as many elements (its dims regrouped), a scalar s."""
    dims = [int(d) for d in rng.integers(1, 4, size=_pick(rng, [2, 3, 4]))]
    cut = int(rng.integers(0, len(dims)))
    target = (*dims[:cut], int(np.prod(dims[cut:])))
    regrouped = target if rng.random() < 0.5 else tuple(int(d) for d in rng.permutation(dims))
    return {"x": _arr(rng, *dims), "s": _scalar(rng), "c": regrouped}


def _build() -> list[Axiom]:
    A = Axiom

    def L(name: str, lhs: Any, rhs: Any, *rest: Any, **kw: Any) -> Axiom:
        """An axiom triggered by its left side only."""
        return Axiom(name, lhs, rhs, *rest, pattern=lhs, **kw)

    ax = [
        # -- element-wise algebra
        A("ewadd_assoc", _add("x", _add("y", "z")), _add(_add("x", "y"), "z"), ("x", "y", "z"), (), _same("x y z")),
        A("ewadd_comm", _add("x", "y"), _add("y", "x"), ("x", "y"), (), _same("x y")),
        A("ewmul_assoc", _mul("x", _mul("y", "z")), _mul(_mul("x", "y"), "z"), ("x", "y", "z"), (), _same("x y z")),
        A("ewmul_comm", _mul("x", "y"), _mul("y", "x"), ("x", "y"), (), _same("x y")),
        A("ewmul_distrib_ewadd", _mul(_add("x", "y"), "z"), _add(_mul("x", "z"), _mul("y", "z")),
          ("x", "y", "z"), (), _same("x y z")),
        A("smul_assoc", _smul(_smul("x", "s"), "t"), _smul("x", _smul("s", "t")), ("x", "s", "t"), (),
          lambda rng: (lambda s: {**_same("x")(rng), "s": s, "t": _arr(rng, *s.shape)})(_scalar(rng))),
        A("smul_distrib_ewadd", _smul(_add("x", "y"), "s"), _add(_smul("x", "s"), _smul("y", "s")),
          ("x", "y", "s"), (), lambda rng: {**_same("x y")(rng), "s": _scalar(rng)}),
        A("smul_ewmul", _mul(_smul("x", "s"), "y"), _smul(_mul("x", "y"), "s"), ("x", "y", "s"), (),
          lambda rng: {**_same("x y")(rng), "s": _scalar(rng)}),
        # -- element-wise subtraction: linear, so it commutes with what ewadd commutes with
        A("ewsub_ewadd_assoc", _sub(_add("x", "y"), "z"), _add("x", _sub("y", "z")), ("x", "y", "z"), (),
          _same("x y z")),
        A("ewsub_ewadd_rhs", _sub("x", _add("y", "z")), _sub(_sub("x", "y"), "z"), ("x", "y", "z"), (),
          _same("x y z")),
        A("ewmul_distrib_ewsub", _mul(_sub("x", "y"), "z"), _sub(_mul("x", "z"), _mul("y", "z")),
          ("x", "y", "z"), (), _same("x y z")),
        A("smul_distrib_ewsub", _smul(_sub("x", "y"), "s"), _sub(_smul("x", "s"), _smul("y", "s")),
          ("x", "y", "s"), (), lambda rng: {**_same("x y")(rng), "s": _scalar(rng)}),
        A("transpose_ewsub", _t(_sub("x", "y")), _sub(_t("x"), _t("y")), ("x", "y"), (), _mat_gen("x:ab y:ab")),
        A("matmul_ewsub_rhs", _mm("x", _sub("y", "z")), _sub(_mm("x", "y"), _mm("x", "z")), ("x", "y", "z"), (),
          _mat_gen("x:ab y:bc z:bc")),
        A("matmul_ewsub_lhs", _mm(_sub("x", "y"), "z"), _sub(_mm("x", "z"), _mm("y", "z")), ("x", "y", "z"), (),
          _mat_gen("x:ab y:ab z:bc")),
        A("conv_ewsub_input", _cv(_sub("x", "y"), "w", act="none"), _sub(_cv("x", "w", act="none"),
                                                                         _cv("y", "w", act="none")),
          ("x", "y", "w"), CONV_PARAMS,
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "y": _img(rng, d), "w": _ker(rng, d)}),
          guard=_same_image),
        A("concat_ewsub", _cat(P("ax"), _sub("a", "b"), _sub("c", "d")), _sub(_cat(P("ax"), "a", "c"),
                                                                             _cat(P("ax"), "b", "d")),
          ("a", "b", "c", "d"), ("ax",),
          lambda rng: (lambda d: {**d, "b": _arr(rng, *d["a"].shape), "d": _arr(rng, *d["c"].shape)})(
              _concat_gen("a c")(rng)),
          guard=lambda e: e.And(e.same_shape("a", "b"), e.same_shape("c", "d"))),
        # x - x is the zero tensor of x's shape: any two such differences of one shape are equal (with the
        # distributive axioms above this makes 0 * y, 0 @ y, conv(0, w), ... zeros too). One multi-pattern
        # over both differences; the guard compares their shapes at every index.
        A("ewsub_self_zero", _sub("a", "a"), _sub("b", "b"), ("a", "b"), (), _same("a b"),
          guard=lambda e: e.same_shape(_sub("a", "a"), _sub("b", "b")), multi=True),
        A("identity_elim", ("identity", {}, "x"), "x", ("x",), (), _same("x")),
        A("relu_idempotent", _relu(_relu("x")), _relu("x"), ("x",), (), _same("x")),
        A("transpose_relu", _t(_relu("x")), _relu(_t("x")), ("x",), (), _same("x", (2,))),
        # -- matmul / transpose
        A("matmul_assoc", _mm("x", _mm("y", "z")), _mm(_mm("x", "y"), "z"), ("x", "y", "z"), (),
          _mat_gen("x:ab y:bc z:cd")),
        A("matmul_ewadd_rhs", _mm("x", _add("y", "z")), _add(_mm("x", "y"), _mm("x", "z")), ("x", "y", "z"), (),
          _mat_gen("x:ab y:bc z:bc")),
        A("matmul_ewadd_lhs", _mm(_add("x", "y"), "z"), _add(_mm("x", "z"), _mm("y", "z")), ("x", "y", "z"), (),
          _mat_gen("x:ab y:ab z:bc")),
        A("matmul_smul_rhs", _mm("x", _smul("y", "s")), _smul(_mm("x", "y"), "s"), ("x", "y", "s"), (),
          _mat_gen("x:ab y:bc s:s")),
        A("matmul_smul_lhs", _mm(_smul("x", "s"), "y"), _smul(_mm("x", "y"), "s"), ("x", "y", "s"), (),
          _mat_gen("x:ab y:bc s:s")),
        A("transpose_involution", _t(_t("x")), "x", ("x",), (), _mat_gen("x:ab")),
        A("transpose_matmul", _t(_mm("x", "y")), _mm(_t("y"), _t("x")), ("x", "y"), (), _mat_gen("x:ab y:bc")),
        A("transpose_ewadd", _t(_add("x", "y")), _add(_t("x"), _t("y")), ("x", "y"), (), _mat_gen("x:ab y:ab")),
        A("transpose_ewmul", _t(_mul("x", "y")), _mul(_t("x"), _t("y")), ("x", "y"), (), _mat_gen("x:ab y:ab")),
        A("transpose_smul", _t(_smul("x", "s")), _smul(_t("x"), "s"), ("x", "s"), (), _mat_gen("x:ab s:s")),
        # -- conv
        # (images of one shape: an image broadcast against a larger one, say 1x1 against 5x5, convolves at every
        # window of the larger one, while its own conv, padded, reads it at one position)
        A("conv_ewadd_input", _cv(_add("x", "y"), "w", act="none"), _add(_cv("x", "w", act="none"),
                                                                         _cv("y", "w", act="none")),
          ("x", "y", "w"), CONV_PARAMS,
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "y": _img(rng, d), "w": _ker(rng, d)}),
          guard=_same_image),
        # kernels of one shape: a broadcast sum (a 1x1 kernel plus a 3x3 one) convolves as the larger kernel,
        # while the 1x1 kernel's own output has another size (equal at some strides, so both sides type-check)
        A("conv_ewadd_weight", _cv("x", _add("w", "v"), act="none"), _add(_cv("x", "w", act="none"),
                                                                          _cv("x", "v", act="none")),
          ("x", "w", "v"), CONV_PARAMS,
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d), "v": _ker(rng, d)}),
          guard=lambda e: e.same_shape("w", "v")),
        A("conv_smul_input", _cv(_smul("x", "s"), "w", act="none"), _smul(_cv("x", "w", act="none"), "s"),
          ("x", "w", "s"), CONV_PARAMS,
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d), "s": _scalar(rng)})),
        A("conv_smul_weight", _cv("x", _smul("w", "s"), act="none"), _smul(_cv("x", "w", act="none"), "s"),
          ("x", "w", "s"), CONV_PARAMS,
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d), "s": _scalar(rng)})),
        # the end pads of a conv beyond what its last window reads: two convs differing only there, with outputs
        # of one size, read the same windows (stride-2 convs of an odd and an even end pad)
        *(A(f"conv{suffix}_end_pads_unread", _cv("x", "w", *bias), _cv("x", "w", *bias, pads=END_PADS),
            ("x", "w", *bias), (*CONV_PARAMS, "act", "qb", "qr"), gen,
            guard=lambda e, bias=bias: e.And(e.p("qb") >= 0, e.p("qr") >= 0, e.same_shape(
                _cv("x", "w", *bias), _cv("x", "w", *bias, pads=END_PADS))),
            multi=True)
          for suffix, bias, gen in (("", (), _end_pads_gen), ("_bias", ("b",), _biased_end_pads_gen))),
        # a stride moves across a 1x1 unpadded conv: such a conv is the same map at every pixel, so subsampling
        # its input is subsampling its output, and a strided conv or pool is its stride-1 form subsampled
        # (same pads: the windows start at 0, s, 2s, ... either way, and there are as many)
        *(A(f"stride_through_1x1{suffix}_after_{name}",
            _cv(inner(ONE), "u", *bias, act=P("act2"), group=P("g2"), pads=(0, 0, 0, 0), strides=STRIDES),
            _cv(inner(STRIDES), "u", *bias, act=P("act2"), group=P("g2"), pads=(0, 0, 0, 0), strides=ONE),
            (*tensors, "u", *bias), (*params, "act2", "g2"), _pointwise_after_gen(name),
            guard=lambda e: e.And(e.dim("u", 2) == 1, e.dim("u", 3) == 1))
          for name, inner, tensors, params in (
              ("conv", lambda s: _cv("x", "w", strides=s), ("x", "w"), (*CONV_PARAMS, "act")),
              ("conv_bias", lambda s: _cvb("x", "w", "b", strides=s), ("x", "w", "b"), (*CONV_PARAMS, "act")),
              ("avgpool", lambda s: ("avgpool", {**AVG, "strides": s}, "x"), ("x",), (*POOL_PARAMS, "cip")),
              ("maxpool", lambda s: ("maxpool", {**POOL, "strides": s}, "x"), ("x",), POOL_PARAMS))
          for suffix, bias in (("", ()), ("_bias", ("c",)))),
        A("conv_relu", _cv("x", "w", act="relu"), _relu(_cv("x", "w", act="none")), ("x", "w"), CONV_PARAMS,
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d)})),
        A("conv_cpool_avgpool",
          _cv("x", CPOOL, act="none", group=P("c")),
          ("avgpool", {**POOL, "count_include_pad": 1}, "x"),
          ("x",), ("sh", "sw", "pt", "pl", "pb", "pr", "c", "kh", "kw", "dt"),
          lambda rng: (lambda d: {**d, "c": d["x"].shape[1], "dt": DOUBLE})(_pool_gen(rng)),
          guard=lambda e: e.And(e.rank("x") == 4, e.dim("x", 1) == e.p("c"))),
        A("conv_iconv_identity",
          _cv("x", _iconv_kernel(), act="none", group=1, strides=(1, 1),
              pads=(F(lambda e: e.div(e.p("kh"), 2)), F(lambda e: e.div(e.p("kw"), 2)),
                    F(lambda e: e.p("kh") - 1 - e.div(e.p("kh"), 2)),
                    F(lambda e: e.p("kw") - 1 - e.div(e.p("kw"), 2)))),
          "x", ("x",), ("c", "kh", "kw", "dt"),
          lambda rng: (lambda d: {**d, "x": _arr(rng, 1, d["c"], 4, 5)})(_iconv_gen(rng)),
          # the image's shape in the guard: with conv's rank fact (rank 4) an unguarded identity would give
          # every tensor rank 4, and prove any rule about tensors of another rank
          guard=lambda e: e.And(e.p("kh") >= 1, e.p("kw") >= 1, e.rank("x") == 4, e.dim("x", 1) == e.p("c"))),
        A("enlarge_conv",
          _cv("x", "w"),
          _cv("x", ("enlarge", {"size": (P("eh"), P("ew"))}, "w"),
              pads=(F(lambda e: e.p("pt") + e.div(e.p("eh") - e.dim("w", 2), 2)),
                    F(lambda e: e.p("pl") + e.div(e.p("ew") - e.dim("w", 3), 2)),
                    F(lambda e: e.p("pb") + e.div(e.p("eh") - e.dim("w", 2), 2)),
                    F(lambda e: e.p("pr") + e.div(e.p("ew") - e.dim("w", 3), 2)))),
          ("x", "w"), (*CONV_PARAMS, "act", "eh", "ew"),
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d), "eh": d["kh"] + 2 * _pick(rng, [0, 1]),
                                    "ew": d["kw"] + 2 * _pick(rng, [0, 1])})),
        A("conv_concat_out_channels",
          _cat(1, _cv("x", "w", group=1), _cv("x", "v", group=1)), _cv("x", _cat(0, "w", "v"), group=1),
          ("x", "w", "v"), ("sh", "sw", "pt", "pl", "pb", "pr", "act"),
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d), "v": _ker(rng, d, m=_pick(rng, [1, 3]))},
                    group_choices=(1,))),
        A("conv_concat_batch",
          _cat(0, _cv("x", "w"), _cv("y", "w")), _cv(_cat(0, "x", "y"), "w"),
          ("x", "y", "w"), (*CONV_PARAMS, "act"),
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "y": _arr(rng, 3, d["cin"], d["h"], d["w_"]),
                                    "w": _ker(rng, d)})),
        A("conv_concat_in_channels",
          _cv(_cat(1, "x", "y"), _cat(1, "w", "v"), act="none", group=1),
          _add(_cv("x", "w", act="none", group=1), _cv("y", "v", act="none", group=1)),
          ("x", "y", "w", "v"), ("sh", "sw", "pt", "pl", "pb", "pr"),
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d), "y": _img(rng, d, c=3),
                                    "v": _ker(rng, d, c=3)}, group_choices=(1,)),
          guard=lambda e: e.dim("x", 1) == e.dim("w", 1)),
        # -- conv with a bias
        A("conv_bias_concat_out_channels",
          _cat(1, _cvb("x", "w", "b", group=1), _cvb("x", "v", "c", group=1)),
          _cvb("x", _cat(0, "w", "v"), _cat(0, "b", "c"), group=1),
          ("x", "w", "v", "b", "c"), ("sh", "sw", "pt", "pl", "pb", "pr", "act"),
          _biased_gen(group_choices=(1,), second=True)),
        A("conv_bias_concat_batch",
          _cat(0, _cvb("x", "w", "b"), _cvb("y", "w", "b")), _cvb(_cat(0, "x", "y"), "w", "b"),
          ("x", "y", "w", "b"), (*CONV_PARAMS, "act"), _biased_gen(other_image=True)),
        A("conv_bias_relu", _cvb("x", "w", "b", act="relu"), _relu(_cvb("x", "w", "b", act="none")),
          ("x", "w", "b"), CONV_PARAMS, _biased_gen()),
        A("conv_bias_ewadd_weight", _cvb("x", _add("w", "v"), _add("b", "c"), act="none"),
          _add(_cvb("x", "w", "b", act="none"), _cvb("x", "v", "c", act="none")),
          ("x", "w", "v", "b", "c"), CONV_PARAMS,
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d), "v": _ker(rng, d),
                                    "b": _vec(rng, d["m"]), "c": _vec(rng, d["m"])}),
          guard=lambda e: e.And(e.same_shape("w", "v"), e.same_shape("b", "c"))),
        A("conv_bias_smul_weight", _cvb("x", _smul("w", "s"), _smul("b", "s"), act="none"),
          _smul(_cvb("x", "w", "b", act="none"), "s"), ("x", "w", "b", "s"), CONV_PARAMS,
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d), "b": _vec(rng, d["m"]),
                                    "s": _scalar(rng)})),
        A("enlarge_conv_bias",
          _cvb("x", "w", "b"),
          _cvb("x", ("enlarge", {"size": (P("eh"), P("ew"))}, "w"), "b",
               pads=(F(lambda e: e.p("pt") + e.div(e.p("eh") - e.dim("w", 2), 2)),
                     F(lambda e: e.p("pl") + e.div(e.p("ew") - e.dim("w", 3), 2)),
                     F(lambda e: e.p("pb") + e.div(e.p("eh") - e.dim("w", 2), 2)),
                     F(lambda e: e.p("pr") + e.div(e.p("ew") - e.dim("w", 3), 2)))),
          ("x", "w", "b"), (*CONV_PARAMS, "act", "eh", "ew"),
          _conv_gen(lambda rng, d: (lambda w: {"x": _img(rng, d), "w": w, "b": _vec(rng, w.shape[0]),
                                               "eh": d["kh"] + 2 * _pick(rng, [0, 1]),
                                               "ew": d["kw"] + 2 * _pick(rng, [0, 1])})(_ker(rng, d)))),
        L("enlarge_own_size", _enlarged("w"), "w", ("w",), ("eh", "ew"),
          _conv_gen(lambda rng, d: (lambda w: {"w": w, "eh": w.shape[2], "ew": w.shape[3]})(_ker(rng, d))),
          guard=lambda e: e.And(e.rank("w") == 4, e.dim("w", 2) == e.p("eh"), e.dim("w", 3) == e.p("ew"))),
        *(L(f"{fact}_enlarge{'' if i is None else f'_{i}'}", (fact, i, _enlarged("w")), F(value), ("w",), ("eh", "ew"),
            _conv_gen(lambda rng, d: {"w": _ker(rng, d), "eh": d["kh"] + 2 * _pick(rng, [0, 1]),
                                      "ew": d["kw"] + 2 * _pick(rng, [0, 1])}), shape=True)
          for fact, i, value in (("rank", None, lambda e: 4), ("dim", 2, lambda e: e.p("eh")),
                                 ("dim", 3, lambda e: e.p("ew")))),
        # -- batch normalization (per channel of axis 1)
        A("batchnorm_concat_channels",
          _cat(1, _bn("a", *BN_PARAMS), _bn("c", *(p + "2" for p in BN_PARAMS))),
          _bn(_cat(1, "a", "c"), *(_cat(0, p, p + "2") for p in BN_PARAMS)),
          ("a", "c", *BN_PARAMS, *(p + "2" for p in BN_PARAMS)), ("eps",), _bn_gen(channels=True)),
        A("batchnorm_concat_batch",
          _cat(0, _bn("a", *BN_PARAMS), _bn("c", *BN_PARAMS)), _bn(_cat(0, "a", "c"), *BN_PARAMS),
          ("a", "c", *BN_PARAMS), ("eps",), _bn_gen(channels=False)),
        # -- concat / split
        A("split_concat_0", _split(0, _cat(P("ax"), "a", "b")), "a", ("a", "b"), ("ax", "s1", "s2"),
          _split_concat_gen, guard=lambda e: e.And(e.p("s1") == e.dim("a", e.p("ax")),
                                                   e.p("s2") == e.dim("b", e.p("ax")))),
        A("split_concat_1", _split(1, _cat(P("ax"), "a", "b")), "b", ("a", "b"), ("ax", "s1", "s2"),
          _split_concat_gen, guard=lambda e: e.And(e.p("s1") == e.dim("a", e.p("ax")),
                                                   e.p("s2") == e.dim("b", e.p("ax")))),
        A("concat_split", _cat(P("ax"), _split(0, "x"), _split(1, "x")), "x", ("x",), ("ax", "s1", "s2"),
          _split_gen, guard=lambda e: e.And(e.p("s1") >= 0, e.p("s2") >= 0,
                                            e.p("s1") + e.p("s2") == e.dim("x", e.p("ax")))),
        # a one-input Concat is its input (exports write one where a cache of past keys would be concatenated)
        A("concat_single", ("concat", {"axis": P("ax")}, "a"), "a", ("a",), ("ax",), _concat_gen("a", vary=False),
          guard=lambda e: e.And(e.p("ax") >= 0, e.p("ax") < e.rank("a"))),
        A("concat_assoc", _cat(P("ax"), "a", _cat(P("ax"), "b", "c")), _cat(P("ax"), _cat(P("ax"), "a", "b"), "c"),
          ("a", "b", "c"), ("ax",), _concat_gen("a b c")),
        A("concat_geometry", _cat(P("ax1"), _cat(P("ax2"), "a", "b"), _cat(P("ax2"), "c", "d")),
          _cat(P("ax2"), _cat(P("ax1"), "a", "c"), _cat(P("ax1"), "b", "d")), ("a", "b", "c", "d"), ("ax1", "ax2"),
          _geometry_gen, guard=lambda e: e.And(e.Not(e.p("ax1") == e.p("ax2")),
                                               e.dim("a", e.p("ax2")) == e.dim("c", e.p("ax2")))),
        A("concat_ewadd", _cat(P("ax"), _add("a", "b"), _add("c", "d")), _add(_cat(P("ax"), "a", "c"),
                                                                             _cat(P("ax"), "b", "d")),
          ("a", "b", "c", "d"), ("ax",),
          lambda rng: (lambda d: {**d, "b": _arr(rng, *d["a"].shape), "d": _arr(rng, *d["c"].shape)})(
              _concat_gen("a c")(rng)),
          guard=lambda e: e.And(e.same_shape("a", "b"), e.same_shape("c", "d"))),
        A("concat_ewmul", _cat(P("ax"), _mul("a", "b"), _mul("c", "d")), _mul(_cat(P("ax"), "a", "c"),
                                                                             _cat(P("ax"), "b", "d")),
          ("a", "b", "c", "d"), ("ax",),
          lambda rng: (lambda d: {**d, "b": _arr(rng, *d["a"].shape), "d": _arr(rng, *d["c"].shape)})(
              _concat_gen("a c")(rng)),
          guard=lambda e: e.And(e.same_shape("a", "b"), e.same_shape("c", "d"))),
        A("concat_smul", _cat(P("ax"), _smul("a", "s"), _smul("b", "s")), _smul(_cat(P("ax"), "a", "b"), "s"),
          ("a", "b", "s"), ("ax",), _concat_gen("a b", scalar="s")),
        A("concat_relu", _cat(P("ax"), _relu("a"), _relu("b")), _relu(_cat(P("ax"), "a", "b")), ("a", "b"),
          ("ax",), _concat_gen("a b")),
        A("split_relu_0", _split(0, _relu("x")), _relu(_split(0, "x")), ("x",), ("ax", "s1", "s2"), _split_gen),
        A("split_relu_1", _split(1, _relu("x")), _relu(_split(1, "x")), ("x",), ("ax", "s1", "s2"), _split_gen),
        # splitting commutes with element-wise ops of equal-shaped operands, scaling, and a matmul's free axes
        *(L(f"split_{op}_{i}", _split(i, (op, {}, "x", "y")), (op, {}, _split(i, "x"), _split(i, "y")), ("x", "y"),
            ("ax", "s1", "s2"), lambda rng: (lambda d: {**d, "y": _arr(rng, *d["x"].shape)})(_split_gen(rng)),
            guard=lambda e: e.And(e.rank("x") == e.rank("y"), e.dim("x", e.p("ax")) == e.dim("y", e.p("ax"))))
          for op in ("add", "mul") for i in (0, 1)),
        *(L(f"split_smul_{i}", _split(i, _smul("x", "s")), _smul(_split(i, "x"), "s"), ("x", "s"), ("ax", "s1", "s2"),
            lambda rng: {**_split_gen(rng), "s": _scalar(rng)}) for i in (0, 1)),
        *(L(f"split_matmul_rows_{i}", _split(i, _mm("x", "y")), _mm(_split(i, "x"), "y"), ("x", "y"),
            ("ax", "s1", "s2"), _split_matmul_gen(rows=True),
            guard=lambda e: e.And(e.p("ax") == 0, e.rank("x") == 2, e.rank("y") == 2)) for i in (0, 1)),
        *(L(f"split_matmul_cols_{i}", _split(i, _mm("x", "y")), _mm("x", _split(i, "y")), ("x", "y"),
            ("ax", "s1", "s2"), _split_matmul_gen(rows=False),
            guard=lambda e: e.And(e.p("ax") == 1, e.rank("x") == 2, e.rank("y") == 2)) for i in (0, 1)),
        A("concat_transpose", _t(_cat(P("ax"), "a", "b")), _cat(F(lambda e: 1 - e.p("ax")), _t("a"), _t("b")),
          ("a", "b"), ("ax",), _concat_gen("a b", rank=(2,)), guard=lambda e: e.rank("a") == 2),
        A("concat_matmul_shared_lhs", _mm("x", _cat(P("ax"), "y", "z")),
          _cat(F(lambda e: e.max(e.rank("x"), e.rank("y")) - 1), _mm("x", "y"), _mm("x", "z")),
          ("x", "y", "z"), ("ax",), _batched_mm_gen,
          guard=lambda e: e.And(e.p("ax") == e.rank("y") - 1, e.rank("y") == e.rank("z"), e.rank("y") >= 2,
                                e.rank("x") >= 2)),
        A("concat_matmul_shared_rhs", _mm(_cat(P("ax"), "x", "z"), "y"),
          _cat(F(lambda e: e.max(e.rank("x"), e.rank("y")) - 2), _mm("x", "y"), _mm("z", "y")),
          ("x", "y", "z"), ("ax",), _batched_mm_rows_gen,
          guard=lambda e: e.And(e.p("ax") == e.rank("x") - 2, e.rank("x") == e.rank("z"), e.rank("y") >= 2,
                                e.rank("x") >= 2)),
        # the axes as parameters fixed by the guard: rules compute them (rank(x) - 1), and E-matching would not
        # match a computed axis against a literal one
        A("matmul_concat_inner", _mm(_cat(P("ac"), "x", "z"), _cat(P("ar"), "y", "w")),
          _add(_mm("x", "y"), _mm("z", "w")), ("x", "y", "z", "w"), ("ac", "ar"),
          lambda rng: {**_mat_gen("x:ab z:ac y:bd w:cd")(rng), "ac": 1, "ar": 0},
          guard=lambda e: e.And(e.p("ac") == 1, e.p("ar") == 0, e.rank("x") == 2, e.rank("z") == 2,
                                e.rank("y") == 2, e.rank("w") == 2, e.dim("x", 1) == e.dim("y", 0))),
        # -- pooling
        A("avgpool_concat", ("avgpool", AVG, _cat(1, "x", "b")), _cat(1, ("avgpool", AVG, "x"), ("avgpool", AVG, "b")),
          ("x", "b"), (*POOL_PARAMS, "cip"), _pool_gen),
        A("maxpool_concat", ("maxpool", POOL, _cat(1, "x", "b")),
          _cat(1, ("maxpool", POOL, "x"), ("maxpool", POOL, "b")), ("x", "b"), POOL_PARAMS, _pool_gen),
        A("maxpool_relu", ("maxpool", POOL, _relu("x")), _relu(("maxpool", POOL, "x")), ("x",), POOL_PARAMS, _pool_gen),
        A("avgpool_ewadd", ("avgpool", AVG, _add("x", "y")), _add(("avgpool", AVG, "x"), ("avgpool", AVG, "y")),
          ("x", "y"), (*POOL_PARAMS, "cip"), _pool_gen, guard=lambda e: e.same_shape("x", "y")),
        # -- zero padding is linear, and the zero tensor (x - x) stays zero under ops that map 0 to 0
        *(L(f"pad_{op}", ("pad", {"pads": P("pp"), "value": 0.0}, (op, {}, "x", "y")),
            (op, {}, ("pad", {"pads": P("pp"), "value": 0.0}, "x"), ("pad", {"pads": P("pp"), "value": 0.0}, "y")),
            ("x", "y"), ("pp",), _pads_gen("x y"), guard=lambda e: e.same_shape("x", "y"))
          for op in ("add", "sub", "mul")),
        L("pad_neg", ("pad", {"pads": P("pp"), "value": 0.0}, _un("neg", "x")),
          _un("neg", ("pad", {"pads": P("pp"), "value": 0.0}, "x")), ("x",), ("pp",), _pads_gen("x")),
        L("avgpool_ewsub", ("avgpool", AVG, _sub("x", "y")), _sub(("avgpool", AVG, "x"), ("avgpool", AVG, "y")),
          ("x", "y"), (*POOL_PARAMS, "cip"), _pool_gen, guard=lambda e: e.same_shape("x", "y")),
        L("maxpool_zero", ("maxpool", POOL, _sub("x", "x")), _sub(("maxpool", POOL, "x"), ("maxpool", POOL, "x")),
          ("x",), POOL_PARAMS, _pool_gen),
        L("relu_zero", _relu(_sub("x", "x")), _sub(_relu("x"), _relu("x")), ("x",), (), _same("x")),
        # (kernels of one shape: enlarging a 1x1 kernel broadcast against a 3x3 one puts it at the center only)
        L("enlarge_ewsub", _enlarged(_sub("w", "v")), _sub(_enlarged("w"), _enlarged("v")), ("w", "v"), ("eh", "ew"),
          _conv_gen(lambda rng, d: {"w": _ker(rng, d), "v": _ker(rng, d), "eh": d["kh"] + 2 * _pick(rng, [0, 1]),
                                    "ew": d["kw"] + 2 * _pick(rng, [0, 1])}), guard=lambda e: e.same_shape("w", "v")),
        L("conv_ewsub_weight", _cv("x", _sub("w", "v"), act="none"),
          _sub(_cv("x", "w", act="none"), _cv("x", "v", act="none")), ("x", "w", "v"), CONV_PARAMS,
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d), "v": _ker(rng, d)}),
          guard=lambda e: e.same_shape("w", "v")),
        # enlarging a kernel is zero padding: linear for kernels of one shape, and it commutes with a concat of
        # kernels of one spatial size on axis 0 or 1
        *(L(f"enlarge_{op}", _enlarged((op, {}, "w", "v")), (op, {}, _enlarged("w"), _enlarged("v")), ("w", "v"),
            ("eh", "ew"), _conv_gen(lambda rng, d: {"w": _ker(rng, d), "v": _ker(rng, d),
                                                    "eh": d["kh"] + 2 * _pick(rng, [0, 1]),
                                                    "ew": d["kw"] + 2 * _pick(rng, [0, 1])}),
            guard=lambda e: e.same_shape("w", "v")) for op in ("add", "mul")),
        L("enlarge_smul", _enlarged(_smul("w", "s")), _smul(_enlarged("w"), "s"), ("w", "s"), ("eh", "ew"),
          _conv_gen(lambda rng, d: {"w": _ker(rng, d), "s": _scalar(rng), "eh": d["kh"] + 2 * _pick(rng, [0, 1]),
                                    "ew": d["kw"] + 2 * _pick(rng, [0, 1])})),
        L("enlarge_concat", _enlarged(_cat(P("ax"), "w", "v")), _cat(P("ax"), _enlarged("w"), _enlarged("v")),
          ("w", "v"), ("ax", "eh", "ew"),
          _conv_gen(lambda rng, d: (lambda ax: {"w": _ker(rng, d), "v": _ker(rng, d, **{"mc"[ax]: _pick(rng, [1, 3])}),
                                                "ax": ax, "eh": d["kh"] + 2 * _pick(rng, [0, 1]),
                                                "ew": d["kw"] + 2 * _pick(rng, [0, 1])})(_pick(rng, [0, 1]))),
          guard=lambda e: e.And(e.p("ax") >= 0, e.p("ax") <= 1, e.rank("w") == 4, e.rank("v") == 4,
                                e.dim("w", 2) == e.dim("v", 2), e.dim("w", 3) == e.dim("v", 3))),
        # pooling works per image and per channel: it commutes with a concat on axis 0 or 1 (the axis a parameter:
        # rules compute it)
        *(L(f"{op}_concat_images_or_channels", (op, attrs, _cat(P("ax"), "x", "b")),
            _cat(P("ax"), (op, attrs, "x"), (op, attrs, "b")), ("x", "b"), (*params, "ax"),
            _pool_concat_gen,
            guard=lambda e: e.And(e.p("ax") >= 0, e.p("ax") <= 1, e.rank("x") == 4, e.rank("b") == 4))
          for op, attrs, params in (("maxpool", POOL, POOL_PARAMS), ("avgpool", AVG, (*POOL_PARAMS, "cip")))),
        L("ewadd_zero", _add("x", _sub("y", "y")), "x", ("x", "y"), (), _same("x y"),
          guard=lambda e: e.same_shape("x", "y")),
        L("neg_ewadd", _un("neg", _add("x", "y")), _add(_un("neg", "x"), _un("neg", "y")), ("x", "y"), (),
          _same("x y")),
        *(L(f"smul_scalar_{op}", _smul("x", (op, {}, "s", "t")), (op, {}, _smul("x", "s"), _smul("x", "t")),
            ("x", "s", "t"), (), lambda rng: (lambda s: {**_same("x")(rng), "s": s, "t": _arr(rng, *s.shape)})(
                _scalar(rng)), guard=lambda e: e.same_shape("s", "t")) for op in ("add", "sub")),
        # pooling's end pads beyond its last window, as for conv above
        *(A(f"{op}_end_pads_unread", (op, attrs, "x"),
            (op, {**attrs, "pads": END_PADS}, "x"), ("x",), (*params, "qb", "qr"),
            _pool_end_pads_gen,
            guard=lambda e, op=op, attrs=attrs: e.And(e.p("qb") >= 0, e.p("qr") >= 0, e.same_shape(
                (op, attrs, "x"), (op, {**attrs, "pads": END_PADS}, "x"))),
            multi=True)
          for op, attrs, params in (("maxpool", POOL, POOL_PARAMS), ("avgpool", AVG, (*POOL_PARAMS, "cip")))),
        # -- units: ones times x and the identity matrix on either side of a matmul give x back, wherever the
        # product has x's shape (the ones may broadcast)
        L("ewmul_ones", _mul(ONES, "x"), "x", ("x",), ("shp", "dt"), _unit_gen,
          guard=lambda e: e.same_shape(_mul(ONES, "x"), "x")),
        L("matmul_identity_right", _mm("x", _eye("m")), "x", ("x",), ("m", "dt"), _unit_gen,
          guard=lambda e: e.same_shape(_mm("x", _eye("m")), "x")),
        L("matmul_identity_left", _mm(_eye("n"), "x"), "x", ("x",), ("n", "dt"), _unit_gen,
          guard=lambda e: e.same_shape(_mm(_eye("n"), "x"), "x")),
        # -- shape facts
        A("rank_matmul", ("rank", None, _mm("x", "y")), F(lambda e: e.max(e.rank("x"), e.rank("y"))), ("x", "y"), (),
          _batched_mm_gen, shape=True, pattern=_mm("x", "y")),
        A("dim_matmul_last", ("dim", F(lambda e: e.max(e.rank("x"), e.rank("y")) - 1), _mm("x", "y")),
          ("dim", F(lambda e: e.rank("y") - 1), "y"), ("x", "y"), (), _batched_mm_gen, shape=True,
          pattern=_mm("x", "y")),
        A("dim_matmul_rows", ("dim", F(lambda e: e.max(e.rank("x"), e.rank("y")) - 2), _mm("x", "y")),
          ("dim", F(lambda e: e.rank("x") - 2), "x"), ("x", "y"), (), _batched_mm_gen, shape=True,
          pattern=_mm("x", "y")),
        A("rank_conv", ("rank", None, _cv("x", "w")), F(lambda e: 4), ("x", "w"), (*CONV_PARAMS, "act"),
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d)}), shape=True, pattern=_cv("x", "w")),
        A("dim_conv_channels", ("dim", 1, _cv("x", "w")), ("dim", 0, "w"), ("x", "w"), (*CONV_PARAMS, "act"),
          _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d)}), shape=True, pattern=_cv("x", "w")),
        A("rank_conv_bias", ("rank", None, _cvb("x", "w", "b")), F(lambda e: 4), ("x", "w", "b"),
          (*CONV_PARAMS, "act"), _biased_gen(), shape=True, pattern=_cvb("x", "w", "b")),
        A("dim_conv_bias_channels", ("dim", 1, _cvb("x", "w", "b")), ("dim", 0, "w"), ("x", "w", "b"),
          (*CONV_PARAMS, "act"), _biased_gen(), shape=True, pattern=_cvb("x", "w", "b")),
        *(A(f"dim_const_pool_{i}", ("dim", i, CPOOL), F(value), (), ("c", "kh", "kw", "dt"),
            lambda rng: {"c": _pick(rng, [1, 2, 4]), "kh": _pick(rng, [1, 3]), "kw": _pick(rng, [1, 3]), "dt": DOUBLE},
            shape=True) for i, value in ((0, lambda e: e.p("c")), (1, lambda e: 1))),
        *(A(f"dim_const_iconv_{i}", ("dim", i, _iconv_kernel()), F(lambda e: e.p("c")), (), ("c", "kh", "kw", "dt"),
            _iconv_gen, shape=True) for i in (0, 1)),
        A("rank_batchnorm", ("rank", None, _bn("a", *BN_PARAMS)), ("rank", None, "a"), ("a", *BN_PARAMS),
          ("eps",), _bn_gen(channels=False), shape=True, pattern=_bn("a", *BN_PARAMS)),
        A("dim_batchnorm", ("dim", P("i"), _bn("a", *BN_PARAMS)), ("dim", P("i"), "a"), ("a", *BN_PARAMS),
          ("eps", "i"), lambda rng: (lambda d: {**d, "i": int(rng.integers(d["a"].ndim))})(_bn_gen(False)(rng)),
          shape=True, pattern=_bn("a", *BN_PARAMS)),
        # -- the algebra of today's models: division, negation, powers, exp/erf, masks, unit axes, reductions.
        # Triggered by their left side only: with both sides as triggers, definitions such as ewsub_def_neg and
        # the involutions feed each other new terms without end (an E-matching loop z3's timeout does not stop).
        L("ewdiv_def", _div("x", "y"), _mul("x", _un("reciprocal", "y")), ("x", "y"), (), _same("x y")),
        L("reciprocal_involution", _un("reciprocal", _un("reciprocal", "x")), "x", ("x",), (), _same("x")),
        L("neg_involution", _un("neg", _un("neg", "x")), "x", ("x",), (), _same("x")),
        L("ewsub_def_neg", _sub("x", "y"), _add("x", _un("neg", "y")), ("x", "y"), (), _same("x y")),
        L("neg_ewsub", _un("neg", _sub("x", "y")), _sub("y", "x"), ("x", "y"), (), _same("x y")),
        L("neg_ewmul", _mul(_un("neg", "x"), "y"), _un("neg", _mul("x", "y")), ("x", "y"), (), _same("x y")),
        L("neg_matmul_left", _mm(_un("neg", "x"), "y"), _un("neg", _mm("x", "y")), ("x", "y"), (), _batched_mm_gen),
        L("neg_matmul_right", _mm("x", _un("neg", "y")), _un("neg", _mm("x", "y")), ("x", "y"), (), _batched_mm_gen),
        L("pow2_ewmul", ("pow", {"exponent": 2.0}, "x"), _mul("x", "x"), ("x",), (), _same("x")),
        L("exp_ewadd", _un("exp", _add("x", "y")), _mul(_un("exp", "x"), _un("exp", "y")), ("x", "y"), (),
          _same("x y")),
        L("erf_odd", _un("erf", _un("neg", "x")), _un("neg", _un("erf", "x")), ("x",), (), _same("x")),
        L("where_same", _where("c", "x", "x"), "x", ("c", "x"), (), _masked("x"),
          guard=lambda e: e.same_shape(_where("c", "x", "x"), "x")),
        L("where_ewmul", _mul(_where("c", "x", "y"), "z"), _where("c", _mul("x", "z"), _mul("y", "z")),
          ("c", "x", "y", "z"), (), _masked("x y z")),
        L("squeeze_unsqueeze", ("squeeze", {"axes": (0,)}, ("unsqueeze", {"axes": (0,)}, "x")), "x", ("x",), (),
          _same("x")),
        *(L(f"{op}_ewadd", (op, FIRST_AXIS, _add("x", "y")), _add((op, FIRST_AXIS, "x"), (op, FIRST_AXIS, "y")),
            ("x", "y"), (), _same("x y"), guard=lambda e: e.same_shape("x", "y"))
          for op in ("reducesum", "reducemean")),
        L("smul_ewmul_scalars", _smul("x", _mul("s", "t")), _smul(_smul("x", "s"), "t"), ("x", "s", "t"), (),
          lambda rng: {**_same("x")(rng), "s": _scalar(rng), "t": _scalar(rng)}),
        L("clip_relu", ("clip", {"min": 0.0, "max": math.inf}, "x"), _relu("x"), ("x",), (), _same("x")),
        # -- zero padding: none is the identity, and before a conv without padding it is the conv's own padding
        # (TF-style exports pad explicitly: symmetric before stride 1, at the end before stride 2, and 1/2 for
        # 5x5 kernels at stride 2). Pad's pads are coded tuples, so one axiom per padding the menus enumerate.
        L("pad_zero", _pad("x", (0, 0, 0, 0)), "x", ("x",), (), lambda rng: {"x": _arr(rng, 1, 2, 3, 3)}),
        *(L(f"conv_pad_{'_'.join(map(str, spatial))}", _cv(_pad("x", spatial), "w", pads=(0, 0, 0, 0)),
            _cv("x", "w", pads=spatial), ("x", "w"), ("sh", "sw", "g", "act"),
            _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d)}))
          for spatial in PAD_INTO_CONV),
        *(L(f"conv_bias_pad_{'_'.join(map(str, spatial))}", _cvb(_pad("x", spatial), "w", "b", pads=(0, 0, 0, 0)),
            _cvb("x", "w", "b", pads=spatial), ("x", "w", "b"), ("sh", "sw", "g", "act"), _biased_gen())
          for spatial in PAD_INTO_CONV),
        # -- an explicit zero pad before a window op that pads too: the two paddings add up (conv: any act,
        # group, stride; average pooling counting its pads, while the sum stays below the kernel as ONNX requires).
        # Guarded by non-negative pads (a negative pad is ill-formed on the left and could be well-formed on the
        # right); a rule's variable pads are non-negative by conv's facts.
        *(L(f"conv{suffix}_pad_into_pads_{_tag(spatial)}", _cv(_pad("x", spatial), "w", *bias),
            _cv("x", "w", *bias, pads=_grown(spatial)), ("x", "w", *bias), (*CONV_PARAMS, "act"), gen,
            guard=_pads_nonneg)
          for spatial in PAD_INTO_CONV
          for suffix, bias, gen in (("", (), _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d)})),
                                    ("_bias", ("b",), _biased_gen()))),
        *(L(f"avgpool_pad_into_pads_{_tag(spatial)}", ("avgpool", {**POOL, "count_include_pad": 1}, _pad("x", spatial)),
            ("avgpool", {**POOL, "pads": _grown(spatial), "count_include_pad": 1}, "x"), ("x",), POOL_PARAMS,
            _pool_pad_gen(spatial),
            guard=lambda e, s=spatial: e.And(_pads_nonneg(e), e.p("pt") + s[0] < e.p("kh"),
                                             e.p("pl") + s[1] < e.p("kw"), e.p("pb") + s[2] < e.p("kh"),
                                             e.p("pr") + s[3] < e.p("kw")))
          for spatial in PAD_INTO_CONV),
        # two zero pads are one; zero padding of the spatial axes commutes with a concat on axis 0 or 1, with
        # smul, and with a matmul of two operands padded alike where the pads are square (top = left,
        # bottom = right: the menu's paddings), the padded zeros meeting zeros
        *(L(f"pad_pad_{_tag(a)}_{_tag(b)}", _pad(_pad("x", a), b),
            _pad("x", tuple(i + j for i, j in zip(a, b, strict=True))), ("x",), (),
            lambda rng: {"x": _arr(rng, *(int(d) for d in rng.integers(1, 4, size=4)))},
            guard=lambda e: e.rank("x") == 4)
          for a in PAD_INTO_CONV for b in PAD_INTO_CONV),
        *(L(f"pad_concat_{_tag(spatial)}", _pad(_cat(P("ax"), "a", "b"), spatial),
            _cat(P("ax"), _pad("a", spatial), _pad("b", spatial)), ("a", "b"), ("ax",), _pad_concat_gen,
            guard=lambda e: e.And(e.p("ax") >= 0, e.p("ax") <= 1, e.rank("a") == 4, e.rank("b") == 4))
          for spatial in PAD_INTO_CONV),
        *(L(f"matmul_pad_{_tag(spatial)}", _mm(_pad("x", spatial), _pad("y", spatial)), _pad(_mm("x", "y"), spatial),
            ("x", "y"), (), _mat_gen("x:abcd y:abde"), guard=lambda e: e.And(e.rank("x") == 4, e.rank("y") == 4))
          for spatial in PAD_INTO_CONV if spatial[0] == spatial[1] and spatial[2] == spatial[3]),
        L("pad_smul", ("pad", {"pads": P("pp"), "value": 0.0}, _smul("x", "s")),
          _smul(("pad", {"pads": P("pp"), "value": 0.0}, "x"), "s"), ("x", "s"), ("pp",),
          lambda rng: {**_pads_gen("x")(rng), "s": _scalar(rng)}),
        # -- negation and scalar multiples through linear window ops (and each other); neg keeps its input's shape
        L("conv_neg_input", _cv(_un("neg", "x"), "w", act="none"), _un("neg", _cv("x", "w", act="none")), ("x", "w"),
          CONV_PARAMS, _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d)})),
        L("avgpool_neg", ("avgpool", AVG, _un("neg", "x")), _un("neg", ("avgpool", AVG, "x")), ("x",),
          (*POOL_PARAMS, "cip"), _pool_gen),
        L("avgpool_smul", ("avgpool", AVG, _smul("x", "s")), _smul(("avgpool", AVG, "x"), "s"), ("x", "s"),
          (*POOL_PARAMS, "cip"), lambda rng: {**_pool_gen(rng), "s": _scalar(rng)}),
        L("smul_neg", _smul(_un("neg", "x"), "s"), _un("neg", _smul("x", "s")), ("x", "s"), (),
          lambda rng: {**_same("x")(rng), "s": _scalar(rng)}),
        L("rank_neg", ("rank", None, _un("neg", "x")), ("rank", None, "x"), ("x",), (), _same("x"), shape=True),
        L("dim_neg", ("dim", P("i"), _un("neg", "x")), ("dim", P("i"), "x"), ("x",), ("i",),
          lambda rng: (lambda d: {**d, "i": int(rng.integers(d["x"].ndim))})(_same("x")(rng)), shape=True),
        # -- element-wise ops keep the shape of an operand they apply to itself (x * x, x ** e): what the end-pad
        # axioms' guards need to see through a square
        L("dim_ewmul_self", ("dim", P("i"), _mul("x", "x")), ("dim", P("i"), "x"), ("x",), ("i",),
          lambda rng: (lambda d: {**d, "i": int(rng.integers(d["x"].ndim))})(_same("x")(rng)), shape=True),
        # (x + x and a scalar multiple keep x's shape: what the guard of conv_ewadd_weight needs to see through
        # conv(x, w + w) and conv(x, w + s * w))
        L("dim_ewadd_self", ("dim", P("i"), _add("x", "x")), ("dim", P("i"), "x"), ("x",), ("i",),
          lambda rng: (lambda d: {**d, "i": int(rng.integers(d["x"].ndim))})(_same("x")(rng)), shape=True),
        L("rank_smul", ("rank", None, _smul("x", "s")), ("rank", None, "x"), ("x", "s"), (),
          lambda rng: {**_same("x")(rng), "s": _scalar(rng)}, shape=True),
        L("dim_smul", ("dim", P("i"), _smul("x", "s")), ("dim", P("i"), "x"), ("x", "s"), ("i",),
          lambda rng: (lambda d: {**d, "s": _scalar(rng), "i": int(rng.integers(d["x"].ndim))})(_same("x")(rng)),
          shape=True),
        L("dim_pow", ("dim", P("i"), ("pow", {"exponent": P("e")}, "x")), ("dim", P("i"), "x"), ("x",), ("i", "e"),
          lambda rng: (lambda d: {"x": np.abs(d["x"]) + 0.1, "e": _pick(rng, [2.0, 3.0, 0.5]),
                                  "i": int(rng.integers(d["x"].ndim))})(_same("x")(rng)), shape=True),
        # -- a box filter (average pooling at stride 1, its pads counted) commutes with a stride-1 conv: both are
        # correlations over the same zero-padded input, so the padding may sit on either, the first applied
        L("avgpool_conv_commute",
          ("avgpool", {"kernel": (P("kh"), P("kw")), "strides": (1, 1), "pads": (0, 0, 0, 0), "count_include_pad": 1},
           _cv("x", "w", act="none", strides=(1, 1))),
          _cv(("avgpool", {"kernel": (P("kh"), P("kw")), "strides": (1, 1), "pads": PADS, "count_include_pad": 1}, "x"),
              "w", act="none", strides=(1, 1), pads=(0, 0, 0, 0)),
          ("x", "w"), ("kh", "kw", "pt", "pl", "pb", "pr", "g"),
          _conv_gen(lambda rng, d: (lambda kh, kw: {
              "x": _arr(rng, d["n"], d["cin"], int(rng.integers(6, 9)), int(rng.integers(6, 9))), "w": _ker(rng, d),
              "kh": kh, "kw": kw, "pt": min(d["pt"], kh - 1), "pl": min(d["pl"], kw - 1), "pb": min(d["pb"], kh - 1),
              "pr": min(d["pr"], kw - 1)})(_pick(rng, [1, 2, 3, 3]), _pick(rng, [1, 2, 3, 3]))),
          guard=lambda e: e.And(_pads_nonneg(e), e.p("pt") < e.p("kh"), e.p("pl") < e.p("kw"),
                                e.p("pb") < e.p("kh"), e.p("pr") < e.p("kw"))),
        # -- the identity kernel at any stride: centered (its top and left pads half the kernel), any size reads
        # what a 1x1 one reads; end pads beyond the centered ones stay end pads of the 1x1 kernel. No guard on the
        # strides: both sides have them, so both are ill-formed together.
        L("conv_iconv_strided",
          _cv("x", _iconv_kernel(), act="none", group=1),
          _cv("x", ("const_iconv", {"shape": (P("c"), P("c"), 1, 1), "dtype": P("dt")}), act="none", group=1,
              pads=(0, 0, F(lambda e: e.p("pb") - (e.p("kh") - 1 - e.div(e.p("kh"), 2))),
                    F(lambda e: e.p("pr") - (e.p("kw") - 1 - e.div(e.p("kw"), 2))))),
          ("x",), ("c", "kh", "kw", "dt", "sh", "sw", "pt", "pl", "pb", "pr"), _iconv_strided_gen,
          guard=lambda e: e.And(e.p("kh") >= 1, e.p("kw") >= 1,
                                e.p("pt") == e.div(e.p("kh"), 2), e.p("pl") == e.div(e.p("kw"), 2),
                                e.p("pb") >= e.p("kh") - 1 - e.div(e.p("kh"), 2),
                                e.p("pr") >= e.p("kw") - 1 - e.div(e.p("kw"), 2),
                                e.rank("x") == 4, e.dim("x", 1) == e.p("c"))),
        *(L(f"transpose_{op}", _t(_un(op, "x")), _un(op, _t("x")), ("x",), (), _positive(_mat_gen("x:ab")))
          for op in UNARY),
        *(L(f"concat_{op}", _cat(P("ax"), _un(op, "a"), _un(op, "b")), _un(op, _cat(P("ax"), "a", "b")), ("a", "b"),
            ("ax",), _positive(_concat_gen("a b"))) for op in UNARY),
        A("rank_concat", ("rank", None, _cat(P("ax"), "a", "b")), ("rank", None, "a"), ("a", "b"), ("ax",),
          _concat_gen("a b"), shape=True),
        A("dim_concat_axis", ("dim", P("ax"), _cat(P("ax"), "a", "b")),
          F(lambda e: e.dim("a", e.p("ax")) + e.dim("b", e.p("ax"))), ("a", "b"), ("ax",), _concat_gen("a b"),
          shape=True, pattern=_cat(P("ax"), "a", "b")),
        # triggered by their left side: the right side's rank(x) / dim(x, i) matches every shape term and would
        # wrap each tensor in relu after relu
        L("rank_relu", ("rank", None, _relu("x")), ("rank", None, "x"), ("x",), (), _same("x"), shape=True),
        L("dim_relu", ("dim", P("i"), _relu("x")), ("dim", P("i"), "x"), ("x",), ("i",),
          lambda rng: (lambda d: {**d, "i": int(rng.integers(d["x"].ndim))})(_same("x")(rng)), shape=True),
        # broadcasting element-wise ops: the result's rank is the larger operand rank
        *(L(f"rank_{op}", ("rank", None, (op, {}, "x", "y")), F(lambda e: e.max(e.rank("x"), e.rank("y"))),
            ("x", "y"), (), _positive(_broadcast_gen), shape=True) for op in ("add", "mul", "sub", "div")),
        *(L(f"rank_{op}", ("rank", None, (op, attrs, "x")), F(lambda e: 4), ("x",), params, _pool_gen, shape=True)
          for op, attrs, params in (("maxpool", POOL, POOL_PARAMS), ("avgpool", AVG, (*POOL_PARAMS, "cip")))),
        L("rank_transpose", ("rank", None, ("transpose", {"perm": P("perm")}, "x")), ("rank", None, "x"), ("x",),
          ("perm",), lambda rng: (lambda x: {"x": x, "perm": tuple(int(i) for i in rng.permutation(x.ndim))})(
              _same("x")(rng)["x"]), shape=True),
        A("rank_split_0", ("rank", None, _split(0, "x")), ("rank", None, "x"), ("x",), ("ax", "s1", "s2"), _split_gen,
          shape=True),
        A("dim_split_0_axis", ("dim", P("ax"), _split(0, "x")), F(lambda e: e.p("s1")), ("x",), ("ax", "s1", "s2"),
          _split_gen, shape=True),
        A("dim_split_1_axis", ("dim", P("ax"), _split(1, "x")), F(lambda e: e.p("s2")), ("x",), ("ax", "s1", "s2"),
          _split_gen, shape=True),
        # -- ONNX Runtime's fused kernels (xflow/ops/_contrib.py): each is its decomposition, stated once per form
        # (inputs present, transposed operands, activation). Triggered by the fused side only.
        *(L(f"skip_layernorm_def_{n}", ("skip_layernorm", {"epsilon": P("eps")}, "x", "s", *params),
            ("layernorm", {"axis": F(lambda e: e.rank("x") - 1), "epsilon": P("eps")}, _add("x", "s"), *params),
            ("x", "s", *params), ("eps",), _skip_gen(params)) for n, params in ((3, ("g",)), (4, ("g", "b")))),
        L("skip_rmsnorm_def", ("skip_rmsnorm", {"epsilon": P("eps")}, "x", "s", "g"),
          ("rmsnorm", {"axis": F(lambda e: e.rank("x") - 1), "epsilon": P("eps")}, _add("x", "s"), "g"),
          ("x", "s", "g"), ("eps",), _skip_gen(("g",))),
        # RMSNorm as transformers' exports write it, the epsilon a constant e that rmsnorm takes as an attribute
        # (a rule's ``value(e)``); the two sides form one multi-pattern: neither binds every variable alone
        *(A(f"rmsnorm_def_{form}", ("rmsnorm", {"axis": P("a"), "epsilon": P("eps")}, "x", "g"),
            _mul("g", scaled(_un("sqrt", _add(("reducemean", {"axes": P("ax"), "keepdims": 1},
                                                ("pow", {"exponent": 2.0}, "x")), "e")))),
            ("x", "g", "e"), ("a", "eps", "ax"), _rms_gen, multi=True,
            guard=lambda v: v.And(v.p("a") == v.rank("x") - 1, v.p("ax") == v.code(v.rank("x") - 1),
                                  v.p("eps") == v.scalar("e"), v.rank("e") == 0))
          for form, scaled in (("reciprocal", lambda r: _mul("x", _un("reciprocal", r))),
                               ("div", lambda r: _div("x", r)))),
        # a constant one divided by y is its reciprocal (torch's rsqrt in the legacy exporter: Div(1, Sqrt(v)))
        L("div_one_reciprocal", _div("o", "y"), _un("reciprocal", "y"), ("o", "y"), (),
          lambda rng: {"o": np.array(1.0), "y": np.abs(_same("y")(rng)["y"]) + 0.1},
          guard=lambda v: v.And(v.scalar_is("o", 1.0), v.rank("o") == 0)),
        # a tensor times a one-element constant holding one is the tensor, exactly (IEEE: x * 1 is x, -0, inf and
        # NaN too); Whisper's attention scales Q and K by 1.0 after splitting the heads
        L("smul_one", _smul("x", "o"), "x", ("x", "o"), (),
          lambda rng: {"x": _same("x")(rng)["x"], "o": np.array(1.0)},
          guard=lambda v: v.scalar_is("o", 1.0)),
        # a cast to the type a tensor already has is the tensor (transformers' .to(input_dtype) on float32)
        L("cast_same_type", ("cast", {"to": P("t")}, "x"), "x", ("x",), ("t",),
          _cast_gen,
          guard=lambda v: v.dtype("x") == v.p("t")),
        L("rotary_def", ("rotary", {}, "x", "p", "c", "s"), _rotate_half("x", _rotary_rows("c", "p"),
                                                                        _rotary_rows("s", "p")),
          ("x", "p", "c", "s"), (), _rotary_gen),
        L("ms_gelu_def", ("ms_gelu", {}, "x"), ("gelu", {"approximate": "none"}, "x"), ("x",), (), _same("x")),
        L("bias_gelu_def", ("bias_gelu", {}, "x", "b"), ("gelu", {"approximate": "none"}, _add("x", "b")), ("x", "b"),
          (), _bias_gen),
        L("fast_gelu_def", ("fast_gelu", {}, "x"), ("gelu", {"approximate": "tanh"}, "x"), ("x",), (), _same("x")),
        L("fast_gelu_bias_def", ("fast_gelu", {}, "x", "b"), ("gelu", {"approximate": "tanh"}, _add("x", "b")),
          ("x", "b"), (), _bias_gen),
        L("quick_gelu_silu", ("quick_gelu", {"alpha": 1.0}, "x"), _mul("x", ("sigmoid", {}, "x")), ("x",), (),
          _same("x")),
        L("fused_matmul_plain", _fmm(0, 0, "x", "y"), _mm("x", "y"), ("x", "y"), (), _batched_mm_gen),
        *(L(f"fused_matmul_trans_b_{rank}", _fmm(0, 1, "x", "y"), _mm("x", _swap_t(rank, "y")), ("x", "y"),
            (), _fmm_gen(rank, trans_b=True), guard=lambda e, r=rank: e.rank("y") == r) for rank in (2, 3, 4)),
        *(L(f"fused_matmul_trans_a_{rank}", _fmm(1, 0, "x", "y"), _mm(_swap_t(rank, "x"), "y"), ("x", "y"),
            (), _fmm_gen(rank, trans_b=False), guard=lambda e, r=rank: e.rank("x") == r) for rank in (2, 3, 4)),
        *(L(f"fused_conv_{act.lower()}_{len(args)}", ("fused_conv", {"strides": STRIDES, "pads": PADS, "group": P("g"),
                                                                      "activation": act}, *args),
            (act.lower(), {}, ("conv", _conv(act="none"), *args)), args, CONV_PARAMS,
            _conv_gen(lambda rng, d: {"x": _img(rng, d), "w": _ker(rng, d)}) if len(args) == 2 else _biased_gen())
          for act in ("Relu", "Sigmoid", "Tanh") for args in (("x", "w"), ("x", "w", "b"))),
        # MultiHeadAttention (xflow/ops/attention.py) with scale 1: its decomposition, in the two forms
        # transformers' exports write (the context reshaped to its own shape first, or not)
        *(L(f"mha_def{suffix}", ("mha", {"num_heads": P("h"), "scale": 1.0}, "q", "k", "v"), _attention_core(reshaped),
            ("q", "k", "v"), ("h",), _attention_gen, guard=lambda e: e.p("h") >= 1)
          for suffix, reshaped in (("", False), ("_context_reshaped", True))),
        # a scalar factor moves through any layout op (the exports scale Q and K after splitting the heads)
        L("transpose_perm_smul", ("transpose", {"perm": P("perm")}, _smul("x", "s")),
          _smul(("transpose", {"perm": P("perm")}, "x"), "s"), ("x", "s"), ("perm",), _permuted_gen),
        L("reshape_smul", ("reshape", {"shape": P("c")}, _smul("x", "s")),
          _smul(("reshape", {"shape": P("c")}, "x"), "s"), ("x", "s"), ("c",), _reshaped_gen),
        # -- ONNX Sum of two tensors (xflow/ops/sum.py) is ewadd written as another node; triggered by sum only
        L("ewsum_def", ("sum", {}, "x", "y"), _add("x", "y"), ("x", "y"), (), _same("x y")),
        # -- a per-column scale after a matmul is the matmul by the scaled weight (a layer scale folded into the
        # Linear before it, as ConvNeXt's gamma)
        L("ewmul_matmul_columns", _mul(_mm("x", "w"), "g"), _mm("x", _mul("w", "g")), ("x", "w", "g"), (),
          _column_scale_gen, guard=lambda e: e.And(e.rank("w") == 2, e.rank("g") == 1)),
        # -- a power-of-two scale (xflow/ops/pow2_scale.py): powers compose, the zeroth is nothing, and it moves
        # through a matmul from either operand (what lifts a softmax's denormal probabilities before the matmul
        # reading them and scales the product back)
        L("pow2_scale_compose", _pow2(P("a"), _pow2(P("b"), "x")), _pow2(F(lambda e: e.p("a") + e.p("b")), "x"),
          ("x",), ("a", "b"), _pow2_gen),
        L("pow2_scale_zero", _pow2(0, "x"), "x", ("x",), (), _same("x")),
        A("matmul_pow2_scale_lhs", _mm(_pow2(P("k"), "x"), "y"), _pow2(P("k"), _mm("x", "y")), ("x", "y"), ("k",),
          _pow2_mm_gen),
        A("matmul_pow2_scale_rhs", _mm("x", _pow2(P("k"), "y")), _pow2(P("k"), _mm("x", "y")), ("x", "y"), ("k",),
          _pow2_mm_gen),
        L("rank_pow2_scale", ("rank", None, _pow2(P("k"), "x")), ("rank", None, "x"), ("x",), ("k",),
          lambda rng: {**_same("x")(rng), "k": _pick(rng, POW2_EXPONENTS)}, shape=True),
        L("dim_pow2_scale", ("dim", P("i"), _pow2(P("k"), "x")), ("dim", P("i"), "x"), ("x",), ("i", "k"),
          lambda rng: (lambda d: {**d, "k": _pick(rng, POW2_EXPONENTS), "i": int(rng.integers(d["x"].ndim))})(
              _same("x")(rng)), shape=True),
        # -- a leading unit axis on the lower-rank operand of a broadcasting add changes nothing: broadcasting
        # prepends it anyway (a bias of shape (n) written as (1, n); ORT's MatMulAddFusion takes only the first)
        L("ewadd_unsqueeze_lead", _add("x", ("unsqueeze", {"axes": (0,)}, "y")), _add("x", "y"), ("x", "y"), (),
          _lead_broadcast_gen, guard=lambda e: e.rank("x") > e.rank("y")),
    ]
    names = [a.name for a in ax]
    assert len(names) == len(set(names)), f"duplicate axiom names: {sorted({n for n in names if names.count(n) > 1})}"
    return ax


AXIOMS: tuple[Axiom, ...] = tuple(_build())
eval_z3 = _eval_z3


def axiom_formulas(axioms: tuple[Axiom, ...] = AXIOMS) -> list[z3.BoolRef]:
    """The z3 formulas of ``axioms``."""
    return [a.formula() for a in axioms]

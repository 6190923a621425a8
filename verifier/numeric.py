"""Numeric check of a rule: instantiate it on random small shapes and compare both sides in float64."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

import numpy as np
import onnx

from xflow.errors import XflowError
from xflow.ir import Attrs
from xflow.ops import OPS, ShapeError
from xflow.ops.base import pick
from xflow.rewrite.match import evaluate_template
from xflow.rules.expr import Expr, ExprError, ShapeEnv
from xflow.rules.model import PatternNode, Rule, Var

#: Environment variable choosing the numeric check's array module: ``numpy`` (the default) or ``cupy``. numpy even
#: where a GPU works: the check runs many small float64 ops on tensors of a few hundred elements, where a kernel
#: launch costs more than the arithmetic, and the local verifier workers run under an address-space limit that CUDA
#: cannot start in. An environment variable, not an option, so that worker processes inherit the parent's choice.
BACKEND_ENV = "XFLOW_NUMERIC_BACKEND"
BACKENDS = ("numpy", "cupy")


def _working_cupy() -> Any:
    """The cupy module when it imports and a real call on the GPU succeeds, else None."""
    try:
        import cupy  # type: ignore[import-not-found]

        if float(cupy.asnumpy(cupy.arange(3, dtype=cupy.float64).sum())) != 3.0:
            return None
        return cupy
    except Exception:  # noqa: BLE001 - any failure means no usable GPU
        return None


@cache
def pick_backend(choice: str) -> Any:
    """The array module for ``choice`` (numpy or cupy); an XflowError when it cannot be had. Decided once per
    choice: trying cupy starts a GPU context."""
    if choice == "numpy":
        return np
    if choice != "cupy":
        raise XflowError(None, f"{BACKEND_ENV}={choice!r}: expected {' or '.join(BACKENDS)}")
    cupy = _working_cupy()
    if cupy is None:
        raise XflowError(None, f"{BACKEND_ENV}=cupy, but cupy does not import or finds no working GPU")
    return cupy


def array_module() -> Any:
    """The numeric check's array module, as ``XFLOW_NUMERIC_BACKEND`` chooses (numpy unless it says cupy)."""
    return pick_backend(os.environ.get(BACKEND_ENV) or "numpy")


@dataclass(frozen=True)
class NumericResult:
    """``ok`` when at least one instance ran and every instance agreed within tolerance."""

    ok: bool
    max_abs_err: float
    shapes: list[dict[str, tuple[int, ...]]] = field(default_factory=list)
    trials_run: int = 0
    reason: str = ""


class _Skip(Exception):
    """This random instance does not apply (shapes, where conditions); draw another."""


class _Cannot(Exception):
    """The checker cannot instantiate this rule at all."""


def _to_numpy(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _roles(rule: Rule) -> dict[str, str]:
    """Each rule input's role (the op table's) where the source first reads it. An input read where any tensor
    goes (a layout op's operand) that reaches a position of a stated role through layout ops only takes that
    role: the kernels concatenated before a conv are kernels, the concatenated variances of two batchnorms in a
    lifted rule are variances (drawn positive)."""
    reached: dict[str, str] = {}
    for node in reversed(rule.src):  # readers before the values they read
        entry = OPS[node.op]
        for pos, name in enumerate(node.inputs):
            if entry.role(pos) != "any":
                reached.setdefault(name, entry.role(pos))
            elif entry.family == "layout":
                passed = [reached[o] for o in node.outputs if o in reached]
                if passed:
                    reached.setdefault(name, passed[0])
    roles: dict[str, str] = {}
    for node in rule.src:
        entry = OPS[node.op]
        for pos, name in enumerate(node.inputs):
            if name in rule.inputs and name not in roles:
                role = entry.role(pos)
                roles[name] = ("variance" if reached.get(name) == "variance"
                               else reached.get(name, role) if role == "any" else role)
    return roles


def _channel_anchors(rule: Rule) -> dict[str, str]:
    """Per-channel vectors of the source (a bias beside a kernel, the per-channel parameters of an op applied
    to a kernel's output) and the kernel input whose output channels they must match, where the source says
    so directly (random sizes would almost never agree for the four parameters of a batchnorm)."""
    kernel_of: dict[str, str] = {}
    anchors: dict[str, str] = {}
    for node in rule.src:
        entry = OPS[node.op]
        roles = [entry.role(pos) for pos in range(len(node.inputs))]
        kernels = [name for name, role in zip(node.inputs, roles, strict=True) if role == "kernel"]
        # an op applying a kernel to an image (conv): its output channels are the kernel's
        if kernels and kernels[0] in rule.inputs and roles[0] == "image":
            kernel_of[node.outputs[0]] = kernels[0]
            for name, role in zip(node.inputs, roles, strict=True):
                if role == "bias" and name in rule.inputs:
                    anchors.setdefault(name, kernels[0])
        elif entry.channel_params and node.inputs[0] in kernel_of:
            kernel_of[node.outputs[0]] = kernel_of[node.inputs[0]]
            for pos in entry.channel_params:
                if node.inputs[pos] in rule.inputs:
                    anchors.setdefault(node.inputs[pos], kernel_of[node.inputs[0]])
    return anchors


def _shape(rng: np.random.Generator, role: str, wide: bool = False) -> tuple[int, ...]:
    if wide and role == "image":  # room for strides of 3 and kernels of 4
        return (pick(rng, [1, 2]), pick(rng, [1, 2, 4]), int(rng.integers(4, 10)), int(rng.integers(4, 10)))
    if wide and role == "kernel":  # even and uneven kernels too
        return (pick(rng, [1, 2, 4]), pick(rng, [1, 2, 4]), pick(rng, [1, 2, 3, 4]), pick(rng, [1, 2, 3, 4]))
    if wide and role in ("matrix", "any"):  # sizes 1 to 5: pieces of unequal sizes that add up to equal ones
        return tuple(int(d) for d in rng.integers(1, 6, size=pick(rng, [1, 2, 2, 3, 4] if role == "any" else [2, 3])))
    if role == "image":
        hw = pick(rng, [4, 5])
        return (pick(rng, [1, 2]), pick(rng, [1, 2, 4]), hw, hw)
    if role == "kernel":
        k = pick(rng, [1, 3])
        return (pick(rng, [1, 2, 4]), pick(rng, [1, 2, 4]), k, k)
    if role in ("bias", "channel", "variance"):
        return (pick(rng, [1, 2, 4]),)
    if role == "scalar":
        return pick(rng, [(), (1,)])
    if role == "matrix":
        return tuple(int(d) for d in rng.integers(2, 4, size=pick(rng, [2, 2, 3])))
    return tuple(int(d) for d in rng.integers(2, 4, size=pick(rng, [1, 2, 2, 3, 4])))


def _sample_attr(rng: np.random.Generator, op: str, attr: str, shapes: list[tuple[int, ...]],
                 chosen: dict[str, Any], n_out: int, wide: bool = False) -> Any:
    """A value of ``op.attr`` from the op table's sampling domain (its wider one with ``wide``, where it has one)."""
    spec = next(a for a in OPS[op].attrs if a.name == attr)
    if spec.sample is None:
        raise _Cannot(f"cannot sample attribute {op}.{attr}")
    value = (spec.wide if wide and spec.wide is not None else spec.sample)(rng, shapes, chosen, n_out)
    if value is None:
        raise _Skip
    return value


def _defining(rule: Rule) -> dict[str, list[Expr]]:
    """Where conditions ``v == expr`` (``v`` a variable): sampling ``v`` as ``expr`` finds valid instances of
    rules that tie an attribute to shapes, which random draws would almost never hit."""
    out: dict[str, list[Expr]] = {}
    for cond in rule.where:
        tree = cond.tree
        if (isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], ast.Eq)
                and isinstance(tree.left, ast.Name)):
            out.setdefault(tree.left.id, []).append(Expr(ast.unparse(tree.comparators[0])))
    return out


def _solve(name: str, defining: dict[str, list[Expr]] | None, variables: dict[str, Any],
           all_shapes: dict[str, tuple[int, ...]] | None) -> Any:
    """``name``'s value from its first where definition that evaluates here; None without one (or when it is
    already bound, or there are no definitions or shapes to read)."""
    if name in variables or not defining or all_shapes is None:
        return None
    for expr in defining.get(name, []):
        try:
            value = expr.evaluate(ShapeEnv(variables, all_shapes))
        except (ExprError, KeyError, IndexError, TypeError):
            continue
        return value
    return None


def _concretize(rng: np.random.Generator, node: PatternNode, shapes: list[tuple[int, ...]],
                variables: dict[str, Any], defining: dict[str, list[Expr]] | None = None,
                all_shapes: dict[str, tuple[int, ...]] | None = None, wide: bool = False) -> dict[str, Any]:
    entry = OPS[node.op]
    chosen: dict[str, Any] = {}
    for spec in entry.attrs:
        if spec.name not in node.attrs:
            continue
        template = node.attrs[spec.name]
        if isinstance(template, Var):
            solved = _solve(template.name, defining, variables, all_shapes)
            if solved is not None and rng.random() < 0.9:
                variables[template.name] = solved
            if template.name not in variables:
                variables[template.name] = _sample_attr(rng, node.op, spec.name, shapes, chosen, len(node.outputs),
                                                        wide)
            chosen[spec.name] = variables[template.name]
        elif isinstance(template, tuple) and any(isinstance(t, Var) for t in template):
            values = []
            for t in template:
                if isinstance(t, Var):  # a dim of a shape: from its where definition (tied to the inputs), else small
                    solved = _solve(t.name, defining, variables, all_shapes)
                    variables.setdefault(t.name, pick(rng, [0, 1, 2]) if solved is None else solved)
                    values.append(variables[t.name])
                else:
                    values.append(t)
            chosen[spec.name] = tuple(values)
        else:
            chosen[spec.name] = template
    return _in_float64(node.op, chosen)


def _in_float64(op: str, attrs: dict[str, Any]) -> dict[str, Any]:
    """The attributes with a float32 ``dtype`` (default or given) or a cast's float32 ``to`` made float64: the check
    runs in float64."""
    if "dtype" in OPS[op].attr_names and attrs.get("dtype", onnx.TensorProto.FLOAT) == onnx.TensorProto.FLOAT:
        attrs["dtype"] = onnx.TensorProto.DOUBLE
    if op == "cast" and attrs.get("to") == onnx.TensorProto.FLOAT:
        attrs["to"] = onnx.TensorProto.DOUBLE
    return attrs


@lru_cache(maxsize=1 << 12)
def _normalized_items(op: str, items: tuple[tuple[str, Any], ...]) -> Any:
    return OPS[op].normalize_attrs(dict(items))


def _normalized(op: str, attrs: dict[str, Any]) -> Any:
    """``OPS[op].normalize_attrs(attrs)``, computed once per distinct value (the result is immutable): a check
    draws the same few attribute sets thousands of times, and normalizing them was a quarter of its time."""
    items = tuple(sorted(attrs.items()))
    try:
        hash(items)
    except TypeError:  # a list value: not worth a key
        return OPS[op].normalize_attrs(attrs)
    return _normalized_items(op, items)


@lru_cache(maxsize=1 << 16)
def _shape_rule(op: str, normal: Attrs, ins: tuple[tuple[int, ...], ...]) -> list[tuple[int, ...]] | None:
    """``op``'s output shapes on ``ins``, None when its shape rule refuses them: computed once per distinct value
    (a check draws the same few shapes thousands of times, and the shape rules were a fifth of its time)."""
    try:
        return OPS[op].infer(list(ins), normal)
    except ShapeError:
        return None


@lru_cache(maxsize=1 << 14)
def _fitted(op: str, normal: Attrs, ins: tuple[tuple[int, ...], ...], free: frozenset[int]
            ) -> tuple[list[tuple[int, ...]], tuple[tuple[int, ...], ...]] | None:
    """(output shapes, inputs) with the ``free`` inputs fitted to the shape rule that refuses ``ins``
    (``OpDef.fit_inputs``), None when no fit applies; memoized like ``_shape_rule``."""
    fitted = OPS[op].fit_inputs(list(ins), normal, free)
    if fitted is None or list(fitted) == list(ins):
        return None
    out_shapes = _shape_rule(op, normal, tuple(tuple(f) for f in fitted))
    return None if out_shapes is None else (out_shapes, tuple(tuple(f) for f in fitted))


def _infer(op: str, attrs: dict[str, Any], shapes: dict[str, tuple[int, ...]], inputs: tuple[str, ...],
           outputs: tuple[str, ...], fresh: set[str] | None = None) -> Any:
    """``op``'s normalized attributes, its output shapes recorded in ``shapes`` (ShapeError / _Skip when the
    instance does not apply). Inputs in ``fresh`` (read by no earlier op) that the shape rule refuses are fitted
    to it once (``OpDef.fit_inputs``): most random draws fail on a kernel's channels or a split's sizes."""
    normal = _normalized(op, attrs)
    ins = tuple(shapes[i] for i in inputs)
    out_shapes = _shape_rule(op, normal, ins)
    if out_shapes is None:
        free = frozenset(pos for pos, name in enumerate(inputs) if fresh and name in fresh
                         and inputs.count(name) == 1)
        found = _fitted(op, normal, ins, free) if free else None
        if found is None:
            raise ShapeError(f"{op}: no instance on {list(ins)}")
        out_shapes, fitted = found
        shapes.update((inputs[pos], fitted[pos]) for pos in free)
    if len(out_shapes) != len(outputs):
        raise _Skip
    shapes.update(zip(outputs, out_shapes, strict=True))
    return normal


def _run(xp: Any, steps: list[tuple[PatternNode, Any]], values: dict[str, Any]) -> None:
    """Evaluate the nodes of ``steps`` (each with its normalized attributes) into ``values``."""
    for node, normal in steps:
        outs = OPS[node.op].evaluate(xp, [values[i] for i in node.inputs], normal)
        values.update(zip(node.outputs, outs, strict=True))


def _draw(rng: np.random.Generator, rule: Rule, shapes: dict[str, tuple[int, ...]], roles: dict[str, str],
          magnitude: float, valued: frozenset[str]) -> dict[str, np.ndarray]:
    """Random float64 values of the rule's inputs: variances positive (BatchNormalization takes the square root of
    var + epsilon), the ``valued`` ones float32 numbers (what ``value(t)`` reads, as ONNX stores an attribute)."""
    drawn = {name: rng.uniform(0.5, 1.5, size=shapes[name]) if roles.get(name) == "variance"
             else magnitude * rng.uniform(-1.0, 1.0, size=shapes[name]) for name in rule.inputs}
    # indices (a gather's, rotary's position ids) are whole numbers within the smallest dim of the other inputs,
    # so that every magnitude's instance looks up rows that exist
    rows = min((d for name in rule.inputs if roles.get(name) != "indices" for d in shapes[name]), default=1)
    for name in rule.inputs:
        if roles.get(name) == "indices":
            drawn[name] = rng.integers(0, max(rows, 1), size=shapes[name]).astype(np.float64)
    for name in valued:
        drawn[name] = np.vectorize(lambda v: float(str(np.float32(v))), otypes=[np.float64])(drawn[name])
    for name, value in _fixed_values(rule).items():  # ``value(o) == 1``: o holds 1
        if name in drawn:
            drawn[name] = np.full(shapes[name], float(value))
    return drawn


def _fixed_values(rule: Rule) -> dict[str, Any]:
    """The inputs a where condition ``value(t) == number`` fixes, with the number."""
    out: dict[str, Any] = {}
    for cond in rule.where:
        tree = cond.tree
        if (isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], ast.Eq)
                and isinstance(tree.left, ast.Call) and isinstance(tree.left.func, ast.Name)
                and tree.left.func.id == "value" and isinstance(tree.left.args[0], ast.Name)
                and isinstance(tree.comparators[0], ast.Constant)):
            out[tree.left.args[0].id] = tree.comparators[0].value
    return out


def _valued(rule: Rule) -> frozenset[str]:
    """The rule inputs whose constant values its conditions or target attributes read (``value(t)``)."""
    exprs = [*rule.where]
    stack = [t for node in rule.dst for t in node.attrs.values()]
    while stack:
        t = stack.pop()
        if isinstance(t, Expr):
            exprs.append(t)
        elif isinstance(t, tuple):
            stack.extend(t)
    return frozenset().union(*(e.valued for e in exprs)) & frozenset(rule.inputs)


def _near(rng: np.random.Generator, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """``shapes`` with each distinct dim size replaced by one drawn near it, the same size everywhere it occurs
    (so that the dims the pair was found on to be equal stay equal: channels, a kernel's sizes)."""
    sizes = sorted({d for shape in shapes.values() for d in shape})
    new = {d: pick(rng, [d, d, d + 1, 2 * d, max(1, d - 1)]) if d > 1 else pick(rng, [1, 2]) for d in sizes}
    return {name: tuple(new[d] for d in shape) for name, shape in shapes.items()}


#: The magnitudes of the values drawn, instance after instance: a rule true only on small values
#: (``clip[min=-1, max=1](x) -> x``) has a counterexample at the second instance, before z3 is asked.
VALUE_SCALES = (1.0, 8.0, 1000.0)


def _instance(rule: Rule, rng: np.random.Generator, xp: Any, roles: dict[str, str], anchors: dict[str, str],
              defining: dict[str, list[Expr]], given: dict[str, tuple[int, ...]] | None = None, wide: bool = False,
              magnitude: float = 1.0) -> tuple[float, float, dict[str, tuple[int, ...]]]:
    if given is not None:
        shapes = dict(given)
    else:
        shapes = {name: _shape(rng, roles.get(name, "any"), wide) for name in rule.inputs}
        for name, kernel in anchors.items():
            shapes[name] = (shapes[kernel][0],)
    # Shapes first, values only for an instance whose shapes hold on both sides: most draws are invalid (a
    # kernel's channels that do not meet its image), and drawing their tensors and running their kernels was
    # most of the check's time.
    variables: dict[str, Any] = {}
    try:
        src: list[tuple[PatternNode, Any]] = []
        fresh = set(rule.inputs)
        for node in rule.src:
            attrs = _concretize(rng, node, [shapes[i] for i in node.inputs], variables, defining, shapes, wide)
            src.append((node, _infer(node.op, attrs, shapes, node.inputs, node.outputs, fresh)))
            fresh.difference_update(node.inputs)
        valued = _valued(rule)
        # a rule reading constants' values draws them before its conditions and target read them (any other
        # draws after its shapes hold on both sides, as it always did: the same seed, the same instances)
        drawn = _draw(rng, rule, shapes, roles, magnitude, valued) if valued else {}
        constants = {name: drawn[name] for name in valued}
        # the check's float64 stands for float32 (``_in_float64``): every tensor's element type is float's
        dtypes = dict.fromkeys(shapes, onnx.TensorProto.FLOAT)
        env = ShapeEnv(variables, shapes, constants, dtypes)
        for cond in rule.where:
            if not cond.evaluate(env):
                raise _Skip
        dst_shapes = dict(shapes)
        dst: list[tuple[PatternNode, Any]] = []
        for node in rule.dst:
            local = ShapeEnv(variables, dst_shapes, constants, dtypes)
            attrs = _in_float64(node.op, {k: evaluate_template(t, local) for k, t in node.attrs.items()})
            dst.append((node, _infer(node.op, attrs, dst_shapes, node.inputs, node.outputs)))
        if any(shapes[s] != dst_shapes[d] for s, d in rule.outputs.items()):
            raise _Skip  # the matcher would reject a type change
        if not valued:
            drawn = _draw(rng, rule, shapes, roles, magnitude, valued)
        values: dict[str, Any] = {name: xp.asarray(array) for name, array in drawn.items()}
        # a division by zero or the root of a negative is no error here: a non-finite output is judged below
        with np.errstate(all="ignore"):
            _run(xp, src, values)
            dst_values = dict(values)
            _run(xp, dst, dst_values)
    except (ShapeError, ExprError, IndexError, TypeError, ZeroDivisionError, KeyError, ValueError) as exc:
        if isinstance(exc, _Cannot):
            raise
        raise _Skip from exc
    err, scale = 0.0, 1.0
    for s, d in rule.outputs.items():
        a, b = _to_numpy(values[s]), _to_numpy(dst_values[d])
        if not np.all(np.isfinite(a)):
            raise _Skip  # outside the source's domain (a negative variance): no evidence either way
        if not np.all(np.isfinite(b)):
            return float("inf"), 1.0, {k: v for k, v in shapes.items() if k in rule.inputs}
        if a.size:
            err = max(err, float(np.max(np.abs(a - b))))
            scale = max(scale, float(np.max(np.abs(a))))
    return err, scale, {k: v for k, v in shapes.items() if k in rule.inputs}


def numeric_check(rule: Rule, trials: int = 3, seed: int = 0, xp: Any = None, attempts: int = 4000,
                  rtol: float = 1e-9, found_on: dict[str, tuple[int, ...]] | None = None,
                  wide: bool = False) -> NumericResult:
    """Evaluate ``rule`` on ``trials`` random valid instances (drawn from up to ``attempts`` tries).

    An instance is valid when the source evaluates, the where conditions hold, the target's shape rules
    accept it and every mapped output keeps its shape. ``ok`` is False on any mismatch, or when no
    valid instance was found (``trials_run`` 0, ``reason`` says why). ``found_on`` (the input shapes the
    generator found the rule on) is tried first, then every other draw is a shape near it (a rule pinned to
    ranks and literal attributes seldom has a valid instance among shapes drawn by role alone), and twice as
    many instances are run: a candidate that holds only on the sizes it was found on (a matmul of 1 x 1
    matrices equal to their product) is refuted here, cheaply, instead of costing z3 its whole budget.
    With ``wide`` the shapes drawn by role and the attributes drawn for a rule's variables come from wider
    domains (larger images, kernels of 1 to 4, the op table's ``AttrSpec.wide``: strides of 3, uneven
    strides and pads), reaching instances a generalized rule claims and the usual draws never make.
    """
    near_found = None
    if found_on is not None and set(found_on) == set(rule.inputs):
        near_found = {name: tuple(shape) for name, shape in found_on.items()}
    xp = array_module() if xp is None else xp
    rng = np.random.default_rng(seed)
    roles = _roles(rule)
    anchors = _channel_anchors(rule)
    defining = _defining(rule)
    worst, seen, run = 0.0, [], 0
    wanted = trials if near_found is None else 2 * trials
    for attempt in range(attempts):
        given = None
        if near_found is not None and attempt % 2 == 0:
            given = near_found if attempt == 0 else _near(rng, near_found)
        try:
            err, scale, shapes = _instance(rule, rng, xp, roles, anchors, defining, given, wide,
                                           VALUE_SCALES[run % len(VALUE_SCALES)])
        except _Skip:
            continue
        except _Cannot as exc:
            return NumericResult(False, 0.0, seen, run, str(exc))
        run += 1
        seen.append(shapes)
        worst = max(worst, err)
        if err > rtol * scale:
            return NumericResult(False, worst, seen, run, f"mismatch {err:.3g} on shapes {shapes}")
        if run >= wanted:
            break
    if run == 0:
        return NumericResult(False, 0.0, [], 0, f"no valid instance in {attempts} attempts")
    return NumericResult(True, worst, seen, run, "" if run >= trials else f"only {run} valid instances")


__all__ = ["BACKEND_ENV", "BACKENDS", "NumericResult", "array_module", "numeric_check", "pick_backend"]

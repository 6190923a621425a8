"""The op-table entry type and the contexts its ONNX codecs work in.

An ``OpDef`` is the one place an operator's meaning lives: its ONNX mapping both ways, attributes (with
their z3 encoding and sampling domain), input roles, shape rule and the z3 facts it guarantees, reference
kernel, integer fingerprint variant, algebraic properties, z3 symbol, enumeration menu, placement family and
dtype rule. Other packages read these fields (or views computed from them); none re-declares them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import numpy as np
import onnx

from xflow.ir import Attrs, Node, Shape, TensorType
from xflow.ir.dims import SymbolSource, as_dim, has_symbols


class ShapeError(ValueError):
    """An operator was applied to shapes or attributes it does not accept."""


class DecodeContext(Protocol):
    """What a decoder may ask about the graph being loaded."""

    opset: int

    def type_of(self, name: str) -> TensorType | None: ...

    def constant_value(self, name: str) -> np.ndarray | None: ...

    def constant_array(self, name: str) -> np.ndarray | None: ...

    def fresh_name(self, hint: str) -> str: ...

    def add_constant(self, array: np.ndarray, hint: str) -> str: ...


class EncodeContext(Protocol):
    """What an encoder may ask of the model being written (``type_of``: a value's type, for a node whose
    attributes hold dims over symbols, written against its input's dims; ``symbol_source``: which graph
    input's dim a run reads a symbol from, for a reshape target computed at run time)."""

    opset: int

    def type_of(self, name: str) -> TensorType | None: ...

    def symbol_source(self, name: str) -> SymbolSource | None: ...

    def add_constant(self, array: np.ndarray, hint: str) -> str: ...

    def fresh_name(self, hint: str) -> str: ...


ShapeRule = Callable[[Sequence[Shape], Attrs], list[Shape]]
#: Draws a value of one attribute for a numeric check: (rng, the node's input shapes, the attributes drawn
#: before it, the node's output count) -> a value, or None when no value fits these shapes.
Sampler = Callable[[np.random.Generator, Sequence[Shape], Mapping[str, Any], int], Any]
#: How an attribute is encoded for z3: an int n (n Int slots; tuples of length n), "choice" (one Int: the index
#: of the value in the attribute's choices), "float" (one Int: the float32 bits), "code" (one Int: an
#: injective code of a tuple whose length varies) or "sizes" (one Int per output of the node).
Z3Kind = int | str
#: What an input of an op holds, as the generator types operands and the numeric check draws shapes:
#: "any"; "image" (an NCHW activation); "kernel" (a conv weight, output channels first); "bias" (a vector per
#: output channel of the kernel beside it); "channel" (a vector per channel of input 0); "variance" (the same,
#: positive); "scalar" (one element); "matrix" (rank >= 2, contracted).
Role = str
#: Placement-feature families, in feature-column order; an op's ``family`` is one of them or "" (other).
FAMILIES: tuple[str, ...] = ("convolution", "matrix", "elementwise", "activation", "pool", "norm", "layout")
Kernel = Callable[[Any, Sequence[Any], Attrs], list[Any]]
#: An op's output elements as terms of its input elements, for ``xflow.check.terms`` (which decides the split
#: simplifications): (object arrays of the inputs' terms, attrs, the inputs' declared shapes, symbolic dims included,
#: a tag naming the op and its attributes) -> the outputs' object arrays. ValueError where the op cannot be decided
#: so (a symbolic dim along an axis it cuts or contracts, other ranks).
TermRule = Callable[[Sequence[np.ndarray], Attrs, Sequence[Shape], Any], list[np.ndarray]]
Decoder = Callable[[onnx.NodeProto, DecodeContext], list[Node] | None]
Encoder = Callable[[Node, EncodeContext], list[onnx.NodeProto]]


@dataclass(frozen=True)
class Generalize:
    """An attribute the rule generator may make a variable: the variable's name (ops whose attribute means
    the same share it, so they stay equal) and the other values it tries before doing so."""

    var: str
    alternatives: tuple[Any, ...]


@dataclass(frozen=True)
class AttrSpec:
    """One attribute of an op: its name, its default and, when finite, its allowed values; how z3 encodes it
    and how a numeric check draws it (None: it cannot be drawn)."""

    name: str
    default: Any = None
    choices: tuple[Any, ...] | None = None
    z3: Z3Kind = 1
    sample: Sampler | None = None
    generalize: Generalize | None = None
    #: A wider domain for the numeric check of a candidate z3 could not settle (None: ``sample``'s): values a
    #: generalized rule claims but the usual draws never reach (strides of 3, uneven strides or pads).
    wide: Sampler | None = None
    # True when a value may hold dims over symbols (a reshape's target: its encoder writes them against the
    # input's dims); any other attribute is a constant of the model, so a symbol there is no match
    symbolic: bool = False


def pick(rng: np.random.Generator, seq: Sequence[Any]) -> Any:
    """One element of ``seq``, uniformly (one integer draw, so seeded runs repeat)."""
    return seq[int(rng.integers(len(seq)))]


def one_of(*values: Any) -> Sampler:
    """A sampler drawing uniformly from ``values`` (repeat a value to weight it)."""
    return lambda rng, shapes, chosen, n_out: pick(rng, values)


class ShapeFacts(Protocol):
    """The shape terms an op's ``facts`` are written in (z3's, from the verifier)."""

    def rank(self, t: Any) -> Any: ...

    def dim(self, t: Any, i: Any) -> Any: ...

    def symbolic(self, v: Any) -> bool: ...

    def int(self, v: Any) -> Any: ...

    def both(self, *facts: Any) -> Any: ...

    def div(self, a: Any, b: Any) -> Any: ...


#: The facts an application of the op guarantees about its inputs' shapes in a valid graph, as terms of
#: ``ShapeFacts`` (the z3 side of the numpy shape rule): (shape terms, attributes, input tensors) -> facts.
Facts = Callable[[ShapeFacts, Mapping[str, Any], Sequence[Any]], list[Any]]
#: The facts an application guarantees about its outputs' shapes, in terms of its inputs' (the shape rule's
#: output): (shape terms, attributes, input tensors, output tensors) -> facts. Only what z3 keeps linear.
OutputFacts = Callable[[ShapeFacts, Mapping[str, Any], Sequence[Any], Sequence[Any]], list[Any]]
#: The numeric check's repair of a random draw the shape rule refused: (input shapes, attributes, the input
#: positions it may change) -> input shapes the rule accepts, or None when it knows none. The positions are the
#: rule inputs no earlier op of the draw read, so a change cannot undo what an earlier op checked.
Fit = Callable[[Sequence[Shape], Attrs, frozenset[int]], list[Shape] | None]
#: Turns a menu entry into attributes on the operand shapes, or None when the entry does not apply there.
MenuResolver = Callable[[dict[str, Any], Sequence[Shape]], dict[str, Any] | None]


@dataclass(frozen=True)
class Menu:
    """How the rule generator enumerates an op: its parameter entries (``resolve`` turns an entry into
    attributes on given operand shapes), how many operands an application takes, and whether those must
    have equal shapes (TASO's ewadd/ewmul take no broadcasting). With ``activations_only`` the first operand is
    never a weight: load folds such an op on constants (an erf or a pad of a weight is a new constant), so a
    rule about it could never fire, and enumerating it only costs time."""

    entries: tuple[Mapping[str, Any], ...] = ({},)
    arity: int = 1
    resolve: MenuResolver | None = None
    same_shapes: bool = False
    activations_only: bool = False


#: ``max_inputs`` of an op that takes any number of inputs (concat): its arity is part of the application
VARIADIC = 1 << 16


@dataclass(frozen=True)
class OpDef:
    """An operator of the substitution algebra."""

    name: str
    onnx_types: tuple[str, ...]
    min_inputs: int
    max_inputs: int
    attrs: tuple[AttrSpec, ...]
    shape: ShapeRule
    kernel: Kernel
    decode: Decoder | None
    encode: Encoder
    doc: str = ""
    int_kernel: Kernel | None = None
    num_outputs: Callable[[Attrs], int] = field(default=lambda attrs: 1)
    commutative: bool = False
    associative: bool = False
    elementwise: bool = False
    linear: bool = False  # op(a + b, ...) = op(a, ...) + op(b, ...) over its non-scalar inputs together
    weights_only: bool = False  # applied only to constants (enlarge, TASO's constant tensors)
    # op(x, x) is one constant whatever x is (sub: zeros, div: ones wherever it is defined): the generator never
    # applies it to one tensor twice. Such a graph computes a constant the long way, no model does that, and
    # every zero of a shape has one fingerprint, so each pairs with all the others: 42% of the proved <= 3-op
    # rules held a sub(x, x) and none could fire on a model
    constant_on_equal_inputs: bool = False
    # its output is its first input, unchanged (Identity): a source node of this op over a constant passes the
    # constant on, so new nodes reading it fold as if they read the constant (``fold_constants``)
    forwards_input: bool = False
    # inputs that are per-channel vectors along axis 1 of input 0 (batchnorm's scale, bias, mean, var): on a
    # piece of a split along the channels they are that piece's slice, so the op on the pieces is the op on
    # the whole with those inputs concatenated
    channel_params: tuple[int, ...] = ()
    # how the checker of split simplifications evaluates it (None: by its elementwise / channel_params flags, else
    # not at all)
    terms: TermRule | None = None
    z3_symbol: str = ""
    roles: tuple[Role, ...] = ()  # per input position; positions beyond are "any"
    facts: Facts | None = None  # z3 facts beside the shape rule (None: none)
    output_facts: OutputFacts | None = None  # z3 facts of the outputs' shapes (None: none)
    menu: Menu | None = None  # None: the generator does not enumerate this op
    family: str = ""  # one of FAMILIES, or "" (other)
    same_dtype_inputs: bool = True  # False: inputs may differ in element type (a scalar operand)
    flops: Callable[[Sequence[Shape], Sequence[Shape], Attrs], int] | None = None  # default: one per output element
    # the outputs' element type from the inputs' and the attributes (None: the first input's; a cast's is
    # its target, a comparison's is bool, where's is its second input's)
    out_dtype: Callable[[Sequence[int], Attrs], int] | None = None
    # the ONNX domain of ``onnx_types``: "" (the standard operators) or an ONNX Runtime contrib domain
    # ("com.microsoft") for a fused kernel whose meaning is its decomposition
    domain: str = ""
    # the element types ONNX Runtime runs the op on (its kernels' type constraints, with float16 where ORT casts
    # around a float kernel); a rewrite to the op on another type is refused. Empty: any type the op's ONNX
    # definition allows (the standard ops)
    kernel_dtypes: tuple[int, ...] = ()
    # how the numeric check repairs a draw of input shapes this op refuses (None: elementwise ops give a free
    # operand another operand's shape, see ``fit_inputs``; other ops keep the draw)
    fit: Fit | None = None
    # what the op saves depends on the values it reads, not only on their shapes (a scale lifting denormals into
    # the normal range, where the op after it runs at full speed): node costs measured on random inputs cannot see
    # it, so a rule that adds this op is applied at every match and timed end to end (``xflow.optimize.finalize``)
    gain_in_values: bool = False
    # with ``gain_in_values``: the element types it may be written on (a scale by 2**64 overflows float16)
    value_dtypes: tuple[int, ...] = ()

    @property
    def variadic(self) -> bool:
        """Whether the op takes any number of inputs (see ``VARIADIC``)."""
        return self.max_inputs >= VARIADIC

    def channel_params_along(self, axis: int) -> tuple[int, ...]:
        """The inputs that give a piece of input 0 cut along ``axis`` its own slice: ``channel_params``
        along the channels (axis 1), none along any other axis."""
        return self.channel_params if axis == 1 else ()

    def __post_init__(self) -> None:
        if self.family and self.family not in FAMILIES:
            raise ValueError(f"{self.name}: family {self.family!r} is not one of {FAMILIES}")

    def fit_inputs(self, shapes: Sequence[Shape], attrs: Attrs, free: frozenset[int]) -> list[Shape] | None:
        """Input shapes near ``shapes`` that the shape rule may accept, changing only the positions in ``free``
        (see ``Fit``); None when the op knows no repair."""
        if not free:
            return None
        if self.fit is not None:
            return self.fit(shapes, attrs, free)
        fixed = [s for i, s in enumerate(shapes) if i not in free]
        if not self.elementwise or not fixed:
            return None
        return [fixed[0] if i in free else s for i, s in enumerate(shapes)]

    def role(self, position: int) -> Role:
        """What input ``position`` holds (see ``Role``)."""
        return self.roles[position] if position < len(self.roles) else "any"

    def attr(self, name: str) -> AttrSpec:
        """The spec of attribute ``name``; KeyError when the op has none."""
        for spec in self.attrs:
            if spec.name == name:
                return spec
        raise KeyError(f"{self.name} has no attribute {name!r}")

    @cached_property
    def attr_names(self) -> frozenset[str]:
        """Names of the attributes this op takes."""
        return frozenset(a.name for a in self.attrs)

    def normalize_attrs(self, attrs: Mapping[str, Any]) -> Attrs:
        """Fill defaults and reject unknown attributes or values out of their domain."""
        unknown = set(attrs) - self.attr_names
        if unknown:
            raise ShapeError(f"{self.name}: unknown attribute(s) {sorted(unknown)}")
        out: dict[str, Any] = {}
        for spec in self.attrs:
            value = attrs.get(spec.name, spec.default)
            if value is None:
                raise ShapeError(f"{self.name}: attribute {spec.name!r} is required")
            if spec.choices is not None and value not in spec.choices:
                raise ShapeError(f"{self.name}: {spec.name}={value!r} not in {spec.choices}")
            if type(value) is not int and not spec.symbolic and has_symbols(value):
                raise ShapeError(f"{self.name}: {spec.name}={value!r} depends on a dynamic dim")
            out[spec.name] = value
        return Attrs(out)

    def infer(self, shapes: Sequence[Shape], attrs: Attrs) -> list[Shape]:
        """Output shapes for these input shapes; raises ShapeError when they are invalid. Dims may be symbolic
        (``xflow.ir.dims``): a condition a rule cannot decide for every value of the symbols (sympy refuses
        the truth value of ``batch < 4``) is a ShapeError too: no match, never a guess."""
        if not self.min_inputs <= len(shapes) <= self.max_inputs:
            raise ShapeError(f"{self.name}: takes {self.min_inputs}..{self.max_inputs} inputs, got {len(shapes)}")
        try:
            return [tuple(d if type(d) is int else as_dim(d) for d in s) for s in self.shape(shapes, attrs)]
        except TypeError as exc:
            raise ShapeError(f"{self.name}: shapes {list(shapes)} undecided for some sizes ({exc})") from None

    def output_dtype(self, in_dtypes: Sequence[int], attrs: Attrs) -> int:
        """The element type of the outputs for inputs of these element types."""
        if self.out_dtype is not None:
            return int(self.out_dtype(in_dtypes, attrs))
        return int(in_dtypes[0]) if in_dtypes else int(attrs.get("dtype", onnx.TensorProto.FLOAT))

    def count_flops(self, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape], attrs: Attrs) -> int:
        """Arithmetic operations of one application (multiply-adds count two)."""
        if self.flops is not None:
            return int(self.flops(in_shapes, out_shapes, attrs))
        return int(sum(np.prod(s, dtype=np.int64) for s in out_shapes))

    def evaluate(self, xp: Any, arrays: Sequence[Any], attrs: Attrs) -> list[Any]:
        """Run the reference kernel on float arrays of module ``xp`` (numpy or cupy)."""
        return self.kernel(xp, arrays, attrs)

    def evaluate_int(self, xp: Any, arrays: Sequence[Any], attrs: Attrs) -> list[Any]:
        """Run the integer fingerprint variant (wrap-around int64 arithmetic)."""
        return (self.int_kernel or self.kernel)(xp, arrays, attrs)


def make_node(proto_or_name: onnx.NodeProto | str, op: OpDef, inputs: Sequence[str], outputs: Sequence[str],
              attrs: Mapping[str, Any] | None = None) -> Node:
    """Build an IR node of op ``op`` (attributes normalized by it)."""
    name = proto_or_name if isinstance(proto_or_name, str) else proto_or_name.name
    return Node(op.name, tuple(inputs), tuple(outputs), op.normalize_attrs(attrs or {}), name)


def onnx_attrs(proto: onnx.NodeProto) -> dict[str, Any]:
    """The attributes of an ONNX node as python values (graphs left out)."""
    return {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute
            if a.type not in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)}


def static_shape(ctx: DecodeContext, name: str) -> Shape | None:
    """The static shape of a value, or None when unknown or symbolic."""
    t = ctx.type_of(name)
    return t.static_shape if t is not None and t.is_static else None


def symbolic_shape(ctx: DecodeContext, name: str) -> Shape | None:
    """The shape of a value, a dynamic dim as a symbol or an expression over symbols (``xflow.ir.dims``); None
    when the rank or a dim is unknown. A decoder that only needs the rank, or dims it compares through the op
    table's shape rules, takes this one (a symbolic value in an attribute is refused by ``normalize_attrs``)."""
    t = ctx.type_of(name)
    if t is None or t.shape is None or any(d is None for d in t.shape):
        return None
    return t.shape


def normalize_axis(axis: int, rank: int) -> int:
    """Map a possibly negative axis into [0, rank); raises ShapeError when out of range."""
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} out of range for rank {rank}")
    return axis % rank

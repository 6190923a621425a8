"""What xflow relies on about standard ONNX ops it carries through opaquely (outside the algebra): which compute
their outputs from their inputs and attributes alone, and which of those ONNX defines exactly, whatever the kernel.
The op-table ops state their own meaning; these are the facts the clean-up steps after the search need of the rest
(``xflow.rewrite.evaluate``, ``xflow.rewrite.share``)."""

from __future__ import annotations

#: ops whose result ONNX defines exactly, whatever the kernel: data movement, comparisons and selection, integer
#: arithmetic and the IEEE-rounded four operations (one rounding each); not Exp, Sin, Erf or Pow, whose values are
#: the kernel's
EXACT = frozenset({
    "Abs", "Add", "And", "Cast", "Ceil", "Concat", "ConstantOfShape", "Div", "Equal", "Expand", "Flatten", "Floor",
    "Gather", "GatherElements", "GatherND", "Greater", "GreaterOrEqual", "Identity", "IsInf", "IsNaN", "Less",
    "LessOrEqual", "Max", "Min", "Mod", "Mul", "Neg", "Not", "OneHot", "Or", "Pad", "Range", "Reshape", "Shape",
    "Sign", "Size", "Slice", "Split", "Squeeze", "Sub", "Tile", "Transpose", "Trilu", "Unsqueeze", "Where", "Xor",
})

#: ops whose outputs are a function of their inputs and attributes alone (two such nodes on the same inputs compute
#: one value); the exact ones and these (never RandomNormal, RandomUniformLike, Bernoulli, Multinomial, Dropout)
DETERMINISTIC = EXACT | {
    "Constant", "CumSum", "Cos", "Erf", "Exp", "Gelu", "Gemm", "Log", "MatMul", "Pow", "Reciprocal", "ReduceMax",
    "ReduceMean", "ReduceProd", "ReduceSum", "Relu", "Sigmoid", "Sin", "Softmax", "Softplus", "Sqrt", "Tanh",
}

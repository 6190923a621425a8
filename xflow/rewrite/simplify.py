"""Undo the split trees that pairwise rules leave behind once the search is done.

Rules merge two operators at a time, so merging NasRNN's eight gates leaves seven two-way splits per
step, and each gate's add reads one piece of two such trees. The forms below are identities of split
itself (a piece of a piece is a piece; an elementwise op on matching pieces is a piece of the op on the
wholes; a grid of blocks can be cut rows first or columns first) and of matmul's columns (the op table's
``matmul_weight_axis``); they need no search, and each is taken only where it removes kernels. The
written model is still checked against the original by ``xflow optimize``. Each one taken is recorded
(``Simplified.trail``: the nodes it removed and those it added), so that a certificate states it as a step
``xflow check`` re-establishes on its own (``xflow.check.identity``), without this module's reasoning.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise

from xflow.ir import Attrs, Graph, Node, TensorType
from xflow.ops import OPS
from xflow.ops.linalg import MATMUL, matmul_weight_axis
from xflow.ops.shape_ops import CONCAT, SPLIT, nested_split_attrs, split_attrs
from xflow.rewrite.apply import content_name
from xflow.rewrite.fold import fold_constants


@dataclass(frozen=True)
class Instance:
    """One simplification taken: its form (a ``Simplified`` counter's name), the nodes it removed and those it
    added (in the order they were handed to ``Graph.with_nodes``), and the graph it made."""

    form: str
    removed: tuple[Node, ...]
    added: tuple[Node, ...]
    graph: Graph


@dataclass
class Simplified:
    """The simplified graph and what was done to it (``trail``: each simplification in turn; a fold of the new
    weights, when there is one, makes ``graph`` from the last one's)."""

    graph: Graph
    nested_splits: int = 0  # splits of a piece of another split folded into it
    elementwise_hoisted: int = 0  # elementwise ops applied once before a split instead of per piece
    channelwise_hoisted: int = 0  # per-channel ops (batchnorm) applied once before a split along the channels
    regridded: int = 0  # split trees over two axes cut in the other order, so that a hoist applies
    weights_permuted: int = 0  # matmuls given their weight's column blocks in the order a hoist needs
    trail: list[Instance] = field(default_factory=list)

    def took(self, form: str, removed: Iterable[Node], added: Iterable[Node], graph: Graph) -> None:
        """Record one simplification that made ``graph``, and make it the current graph."""
        self.trail.append(Instance(form, tuple(removed), tuple(added), graph))
        self.graph = graph


def simplify_splits(graph: Graph) -> Simplified:
    """Fold nested splits along one axis into one split, and apply an elementwise op once before a
    split when it is applied to every piece of splits alike (pieces of a matmul with a constant weight
    that line up in another order are put in order by permuting the weight's columns); where a tree of
    splits cuts a grid of blocks over two axes and cutting it in the other order lets those apply and
    leaves fewer nodes, it is cut so. Repeated until none applies; new weights are folded."""
    result = Simplified(graph)
    _simplify(result, regrid=True)
    if result.weights_permuted or result.channelwise_hoisted:
        result.graph = fold_constants(result.graph)
    return result


def _simplify(result: Simplified, regrid: bool) -> None:
    while (_fold_nested(result) or _hoist_elementwise(result) or _hoist_channelwise(result)
           or (regrid and _regrid(result))):
        pass


def _add_node(graph: Graph, op: str, inputs: tuple[str, ...], attrs: dict, added: list[Node],
              types: dict[str, TensorType], outputs: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Add ``op`` on ``inputs`` to ``added``, its outputs typed by the op table's shape and dtype rules and,
    unless ``outputs`` names them, named by their content: a node whose outputs the graph or ``added``
    already has (copies of one structure share their constants) is not added again. Its outputs."""
    spec = OPS[op]
    attrs = spec.normalize_attrs(attrs)
    names = outputs or tuple(content_name(op, attrs, inputs, k) for k in range(spec.num_outputs(attrs)))
    if outputs is None and (names[0] in graph.types or names[0] in types):
        return names
    in_types = [types.get(i) or graph.types[i] for i in inputs]
    for name, shape in zip(names, spec.infer([t.shape for t in in_types], attrs), strict=True):
        types[name] = TensorType(spec.output_dtype([t.dtype for t in in_types], attrs), shape)
    added.append(Node(op, inputs, names, attrs))
    return names


def _readers(graph: Graph, value: str) -> list[Node]:
    return [u for u, _ in graph.users.get(value, ())]


def _sole_reader(graph: Graph, value: str) -> Node | None:
    readers = {id(u): u for u in _readers(graph, value)}
    if len(readers) != 1 or value in graph.output_set:
        return None
    return next(iter(readers.values()))


def _fold_nested(result: Simplified) -> bool:
    graph = result.graph
    for inner in graph.nodes:
        if inner.op != SPLIT.name or inner.is_opaque:
            continue
        outer = graph.producers.get(inner.inputs[0])
        if outer is None or outer.op != SPLIT.name or _sole_reader(graph, inner.inputs[0]) is not inner:
            continue
        k = outer.outputs.index(inner.inputs[0])
        attrs = nested_split_attrs(outer.attrs, k, inner.attrs)
        if attrs is None:
            continue
        merged = Node(SPLIT.name, outer.inputs, outer.outputs[:k] + inner.outputs + outer.outputs[k + 1:], attrs)
        nodes = [n for n in graph.nodes if n is not inner and n is not outer] + [merged]
        result.took("nested_splits", [n for n in graph.nodes if n is inner or n is outer], [merged],
                    graph.with_nodes(nodes))
        result.nested_splits += 1
        return True
    return False


def _hoist_elementwise(result: Simplified) -> bool:
    graph = result.graph
    for node in graph.nodes:
        if node.is_opaque or not OPS[node.op].elementwise or OPS[node.op].num_outputs(node.attrs) != 1:
            continue
        splits = [graph.producers.get(i) for i in node.inputs]
        if not splits or any(s is None or s.op != SPLIT.name or s.is_opaque for s in splits):
            continue
        first = splits[0]
        if any(s.attrs["axis"] != first.attrs["axis"] for s in splits):
            continue
        if any(graph.types[s.inputs[0]] != graph.types[first.inputs[0]] for s in splits):
            continue  # pieces of equal shape can still come from wholes that broadcast differently
        found = _pieces(graph, node, splits)
        if found is None:
            continue
        pieces, orders = found
        reweighed = {id(s): w for s, order in zip(splits, orders, strict=True)
                     if order != sorted(order) and (w := _weight_to_permute(graph, s)) is not None}
        permuted = sum(order != sorted(order) and id(s) not in reweighed
                       for s, order in zip(splits, orders, strict=True))
        if 2 * permuted + 2 >= len(splits) + len(pieces):
            continue  # a concat per permuted split would cost what the hoist saves
        added: list[Node] = []
        types: dict[str, TensorType] = {}
        wholes: list[str] = []
        gone_too: set[int] = set()
        for s, order in zip(splits, orders, strict=True):
            if order == sorted(order):
                wholes.append(s.inputs[0])
                continue
            if id(s) in reweighed:
                matmul, weight_axis = reweighed[id(s)]
                wholes.append(_permuted_matmul(graph, matmul, weight_axis, s.attrs["split"], order, added, types))
                gone_too.update((id(s), id(matmul)))
                continue
            # the pieces line up in another order: put them in this one (two merge trees that paired
            # the same pieces differently concatenate their weights in different orders)
            parts = tuple(s.outputs[k] for k in order)
            wholes.append(_add_node(graph, CONCAT.name, parts, {"axis": first.attrs["axis"]}, added, types)[0])
        whole = content_name(node.op, node.attrs, tuple(wholes), 0)
        if whole in graph.types:
            continue
        types[whole] = TensorType(graph.types[node.outputs[0]].dtype, graph.types[first.inputs[0]].shape)
        added.append(Node(node.op, tuple(wholes), (whole,), Attrs(node.attrs)))
        added.append(Node(SPLIT.name, (whole,), tuple(p.outputs[0] for p in pieces), first.attrs))
        gone = ({id(n) for n in pieces} | gone_too
                | {id(s) for s, o in zip(splits, orders, strict=True) if o == sorted(o)})
        result.took("elementwise_hoisted", [n for n in graph.nodes if id(n) in gone], added,
                    graph.with_nodes([n for n in graph.nodes if id(n) not in gone] + added, types=types))
        result.elementwise_hoisted += 1
        result.weights_permuted += len(reweighed)
        return True
    return False


def _hoist_channelwise(result: Simplified) -> bool:
    """A per-channel op (the op table's ``channel_params``: batchnorm) applied alike to every piece of a
    split along the channels, with constant per-channel inputs, becomes one op on the whole with those
    inputs concatenated, before the split. Pairwise conv merges leave a batchnorm per piece, which
    ORT cannot fuse into the merged conv across the split (and runs outside its NCHWc layout)."""
    graph = result.graph
    for split in graph.nodes:
        if split.op != SPLIT.name or split.is_opaque:
            continue
        readers = [_sole_reader(graph, o) for o in split.outputs]
        first = readers[0]
        if first is None or first.is_opaque:
            continue
        params = OPS[first.op].channel_params_along(split.attrs["axis"])
        if not params:
            continue
        if any(r is None or r.op != first.op or r.is_opaque or r.attrs != first.attrs or r.inputs[0] != piece
               or len(r.inputs) != len(first.inputs) or len(r.outputs) != 1
               or any(r.inputs[k] != first.inputs[k] for k in range(1, len(r.inputs)) if k not in params)
               or any(not graph.is_constant_value(r.inputs[k]) for k in params)
               for r, piece in zip(readers, split.outputs, strict=True)):
            continue
        added: list[Node] = []
        types: dict[str, TensorType] = {}
        inputs = [split.inputs[0]]
        for k in range(1, len(first.inputs)):
            parts = tuple(r.inputs[k] for r in readers)  # type: ignore[union-attr]
            inputs.append(_add_node(graph, CONCAT.name, parts, {"axis": 0}, added, types)[0] if k in params
                          else first.inputs[k])
        whole = content_name(first.op, first.attrs, tuple(inputs), 0)
        if whole in graph.types:
            continue
        types[whole] = TensorType(graph.types[first.outputs[0]].dtype, graph.types[split.inputs[0]].shape)
        added.append(Node(first.op, tuple(inputs), (whole,), Attrs(first.attrs)))
        added.append(Node(SPLIT.name, (whole,), tuple(r.outputs[0] for r in readers), split.attrs))  # type: ignore[union-attr]
        gone = {id(split)} | {id(r) for r in readers}
        result.took("channelwise_hoisted", [n for n in graph.nodes if id(n) in gone], added,
                    graph.with_nodes([n for n in graph.nodes if id(n) not in gone] + added, types=types))
        result.channelwise_hoisted += 1
        return True
    return False


def _weight_to_permute(graph: Graph, split: Node) -> tuple[Node, int] | None:
    """The matmul ``split`` cuts the output of, and the axis of its constant weight to permute, when
    putting the split's pieces in another order is permuting that weight's blocks (the split reads
    the matmul's output alone, along the weight's columns); None otherwise."""
    matmul = graph.producers.get(split.inputs[0])
    if matmul is None or matmul.op != MATMUL.name or matmul.is_opaque or not graph.is_constant(matmul.inputs[1]):
        return None
    if _sole_reader(graph, split.inputs[0]) is not split:
        return None
    out_rank = len(graph.types[split.inputs[0]].shape)
    weight_axis = matmul_weight_axis(out_rank, len(graph.types[matmul.inputs[1]].shape), split.attrs["axis"])
    return None if weight_axis is None else (matmul, weight_axis)


def _permuted_matmul(graph: Graph, matmul: Node, weight_axis: int, sizes: tuple[int, ...], order: list[int],
                     added: list[Node], types: dict[str, TensorType]) -> str:
    """Add (to ``added``) the matmul whose output is ``matmul``'s with its blocks of ``sizes`` in
    ``order``: its weight is the old one cut into those blocks and concatenated in that order (constant
    nodes, folded later; copies of one structure share them by their content names). Its output's name."""
    blocks = _add_node(graph, SPLIT.name, (matmul.inputs[1],), split_attrs(weight_axis, sizes), added, types)
    (permuted,) = _add_node(graph, CONCAT.name, tuple(blocks[k] for k in order), {"axis": weight_axis}, added, types)
    return _add_node(graph, matmul.op, (matmul.inputs[0], permuted), matmul.attrs, added, types)[0]


@dataclass
class _Grid:
    """A tree of splits that cuts one value into a grid of blocks over two axes."""

    splits: list[Node]  # the tree's split nodes
    cuts: dict[int, list[int]]  # per axis, the block boundaries (0 ... dim)
    leaves: dict[tuple[int, int], str]  # (block index along the lower axis, along the higher) -> value


def _regrid(result: Simplified) -> bool:
    """Cut a grid-shaped tree of splits in either order, one split per axis level, where the fold and
    hoist that follow leave fewer nodes than there are now (so this never undoes itself)."""
    graph = result.graph
    for root in graph.nodes:
        if root.op != SPLIT.name or root.is_opaque:
            continue
        above = graph.producers.get(root.inputs[0])
        if above is not None and above.op == SPLIT.name and _sole_reader(graph, root.inputs[0]) is root:
            continue  # not the top of its tree
        grid = _grid(graph, root)
        if grid is None:
            continue
        kept = {id(n) for n in grid.splits}
        for first_axis in grid.cuts:
            added, types = _cut(graph, root.inputs[0], grid, first_axis)
            cut = graph.with_nodes([n for n in graph.nodes if id(n) not in kept] + added, types=types)
            trial = Simplified(cut)
            _simplify(trial, regrid=False)
            if len(trial.graph.nodes) < len(graph.nodes):
                result.took("regridded", [n for n in graph.nodes if id(n) in kept], added, cut)
                result.trail.extend(trial.trail)
                result.graph = trial.graph
                result.nested_splits += trial.nested_splits
                result.elementwise_hoisted += trial.elementwise_hoisted
                result.weights_permuted += trial.weights_permuted
                result.channelwise_hoisted += trial.channelwise_hoisted
                result.regridded += 1
                return True
    return False


def _grid(graph: Graph, root: Node) -> _Grid | None:
    """The grid ``root``'s tree of splits cuts its input into: every piece that only another split reads
    is cut further, the others are the blocks; None unless the tree cuts two axes and its blocks are
    exactly the cells between all its cuts."""
    shape = graph.types[root.inputs[0]].shape
    splits: list[Node] = []
    boxes: dict[str, tuple[tuple[int, int], ...]] = {}
    stack = [(root, tuple((0, d) for d in shape))]
    while stack:
        node, box = stack.pop()
        splits.append(node)
        axis, start = node.attrs["axis"], box[node.attrs["axis"]][0]
        for value, size in zip(node.outputs, node.attrs["split"], strict=True):
            piece = box[:axis] + ((start, start + size),) + box[axis + 1:]
            start += size
            below = _sole_reader(graph, value)
            if below is not None and below.op == SPLIT.name and not below.is_opaque:
                stack.append((below, piece))
            else:
                boxes[value] = piece
    axes = sorted({s.attrs["axis"] for s in splits})
    if len(axes) != 2 or len(splits) < 2:
        return None
    cuts = {a: sorted({b[a][0] for b in boxes.values()} | {shape[a]}) for a in axes}
    if any(len(c) < 3 for c in cuts.values()):
        return None
    leaves: dict[tuple[int, int], str] = {}
    for value, box in boxes.items():
        cell = []
        for a in axes:
            lo, hi = box[a]
            i = cuts[a].index(lo)
            if cuts[a][i + 1] != hi:
                return None  # the block spans several cells
            cell.append(i)
        leaves[(cell[0], cell[1])] = value
    if len(leaves) != (len(cuts[axes[0]]) - 1) * (len(cuts[axes[1]]) - 1):
        return None
    return _Grid(splits, cuts, leaves)


def _cut(graph: Graph, value: str, grid: _Grid, first_axis: int) -> tuple[list[Node], dict[str, TensorType]]:
    """The splits that cut ``value`` into ``grid``'s blocks along ``first_axis`` first, each row of
    blocks then along the other axis, and the types of the rows."""
    low, high = sorted(grid.cuts)
    second_axis = high if first_axis == low else low
    sizes = {a: [hi - lo for lo, hi in pairwise(c)] for a, c in grid.cuts.items()}
    added: list[Node] = []
    types: dict[str, TensorType] = {}
    rows = _add_node(graph, SPLIT.name, (value,), split_attrs(first_axis, sizes[first_axis]), added, types)
    for i, row in enumerate(rows):
        cells = [(i, j) if first_axis == low else (j, i) for j in range(len(sizes[second_axis]))]
        _add_node(graph, SPLIT.name, (row,), split_attrs(second_axis, sizes[second_axis]), added, types,
                  outputs=tuple(grid.leaves[c] for c in cells))
    return added, types


def _pieces(graph: Graph, node: Node, splits: list[Node]) -> tuple[list[Node], list[list[int]]] | None:
    """The nodes applying ``node``'s op to the pieces of ``splits``, one per piece of the first split in
    turn, each reading one piece of every split of the same size, and for each split the piece each of
    them reads; None unless they are all that reads the splits' outputs and read each piece once."""
    first = splits[0]
    sizes = first.attrs["split"]
    pieces: list[Node] = []
    orders: list[list[int]] = [[] for _ in splits]
    for i in range(len(first.outputs)):
        readers = {id(u): u for u in _readers(graph, first.outputs[i])}
        match = [u for u in readers.values() if u.op == node.op and u.attrs == node.attrs
                 and len(u.inputs) == len(splits) and u.inputs[0] == first.outputs[i]
                 and all(v in s.outputs and s.attrs["split"][s.outputs.index(v)] == sizes[i]
                         for s, v in zip(splits, u.inputs, strict=True))]
        if len(match) != 1:
            return None
        pieces.append(match[0])
        for order, s, v in zip(orders, splits, match[0].inputs, strict=True):
            order.append(s.outputs.index(v))
    if any(sorted(order) != list(range(len(s.outputs))) for order, s in zip(orders, splits, strict=True)):
        return None  # a piece read twice, or one not read
    wanted = {id(p) for p in pieces}
    for s in splits:
        for o in s.outputs:
            if o in graph.output_set or any(id(u) not in wanted for u in _readers(graph, o)):
                return None
    return pieces, orders

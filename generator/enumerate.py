"""What the generator enumerates over (TASO's algebra, as the op table has it) and the tables its walk reads.

A graph is a tuple of op applications ``(op, attrs, operands)``; ``operands`` index the graph's tensors:
first the fixed inputs of ``INPUTS`` (in order), then each op's outputs in application order. The
graph's outputs are the op outputs no later op consumes (a graph of no op outputs a set of inputs).

Here: the inputs and the menu of applications (``APPLICATIONS``), the seeded integer inputs and the fingerprints of
tensors and graphs, TASO's typing of operands (``operands_typed``), and the arrays the walk tries its last op on
(``KindRows``, ``LastRows``, the multiset hashes and fingerprint caches). The walk itself is ``generator.walk``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from xflow.ir import Attrs
from xflow.ops import OPS, ShapeError

# ---- the menu: inputs and parameter values per op ------------------------------------------------------

#: (name, family, kind, shape). Inputs of one family are interchangeable (renamed canonically). Two kernels of
#: the common sizes (1x1, 3x3), so that two different convolutions of one input can merge.
INPUTS: tuple[tuple[str, str, str, tuple[int, ...]], ...] = (
    ("x1", "x", "any", (4, 4)), ("x2", "x", "any", (4, 4)), ("x3", "x", "any", (4, 4)),
    ("w1", "w", "const", (4, 4)), ("w2", "w", "const", (4, 4)), ("w3", "w", "const", (4, 4)),
    ("i1", "i", "any", (1, 4, 7, 7)), ("i2", "i", "any", (1, 4, 7, 7)),
    ("k33", "k33", "const", (4, 4, 3, 3)), ("k33b", "k33", "const", (4, 4, 3, 3)),
    ("k13", "k13", "const", (4, 4, 1, 3)), ("k31", "k31", "const", (4, 4, 3, 1)),
    ("k11", "k11", "const", (4, 4, 1, 1)), ("k11b", "k11", "const", (4, 4, 1, 1)),
    ("kd", "kd", "const", (4, 1, 3, 3)),
    ("s", "s", "const", ()),
)

#: The ops the generator enumerates (those whose op-table entry has a ``menu``), in name order.
MENU_OPS: tuple[str, ...] = tuple(sorted(name for name, entry in OPS.items() if entry.menu is not None))

Op = tuple[str, Attrs, tuple[int, ...]]
Graph = tuple[Op, ...]


def arity(op: str) -> int:
    """Operands one application of ``op`` takes in the enumeration (its menu's)."""
    return OPS[op].menu.arity  # type: ignore[union-attr]


def resolve(op: str, params: dict[str, Any], shapes: tuple[tuple[int, ...], ...]) -> Attrs | None:
    """The concrete attributes of one menu entry on these operand shapes, or None when it does not apply."""
    entry = OPS[op]
    menu = entry.menu
    attrs = dict(params) if menu is None or menu.resolve is None else menu.resolve(dict(params), shapes)
    if attrs is None:
        return None
    try:
        return entry.normalize_attrs(attrs)
    except ShapeError:
        return None


@dataclass(frozen=True)
class Application:
    """One menu entry of the enumeration: op name, its menu index (the order key) and raw parameters."""

    key: int
    op: str
    params: dict[str, Any]


APPLICATIONS: tuple[Application, ...] = tuple(
    Application(i, op, params) for i, (op, params) in
    enumerate((op, p) for op in MENU_OPS for p in OPS[op].menu.entries))  # type: ignore[union-attr]


BY_OP: dict[str, tuple[Application, ...]] = {
    op: tuple(a for a in APPLICATIONS if a.op == op) for op in dict.fromkeys(a.op for a in APPLICATIONS)}


class IntEvaluator:
    """Fixed random int64 inputs (seeded) and per-tensor fingerprints."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        info = np.iinfo(np.int64)
        self.inputs = [rng.integers(info.min, info.max, size=shape, dtype=np.int64, endpoint=True)
                       for _, _, _, shape in INPUTS]


_SHAPE_TEXT: dict[tuple[int, ...], bytes] = {}


def tensor_fp(array: np.ndarray) -> int:
    """A 64-bit fingerprint of one integer tensor (shape and values)."""
    # as ``np.ascontiguousarray`` gives it: a 0-d array is hashed as its 1-element vector
    a = array if array.flags.c_contiguous and array.ndim else np.ascontiguousarray(array)
    text = _SHAPE_TEXT.get(a.shape)
    if text is None:
        text = _SHAPE_TEXT[a.shape] = repr(a.shape).encode()
    h = hashlib.blake2b(text, digest_size=8)
    h.update(a)  # after the shape's text: the same digest as of the two joined
    return int.from_bytes(h.digest(), "little")


def graph_fp(output_fps: list[int]) -> int:
    """Order-independent fingerprint of a graph from its output tensors' fingerprints (a multiset)."""
    h = hashlib.blake2b(repr(sorted(output_fps)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


@dataclass
class Visit:
    """One enumerated graph as the walk reports it."""

    graph: Graph
    fingerprint: int
    outputs: tuple[int, ...]
    output_fps: tuple[int, ...]
    inputs_used: frozenset[int]
    code: bytes = b""  # compact form: 3 bytes per op (application key, operands, NO_OPERAND padding)


#: Images whose height or width shrinks below this are degenerate: on 1x1 or 2x2 maps stride 1 and 2 (or a
#: pool and the identity) coincide, so identities found there are artifacts of the small enumeration shapes.
MIN_SPATIAL = 3
NO_OPERAND = 255
INPUT_SET = 254  # key of the pseudo-op "this input is an output" in the codes of graphs of no op


def bit_mask(tensors: Iterable[int]) -> int:
    """The set of tensor indices as a bit mask (an operand read twice counts once)."""
    mask = 0
    for t in tensors:
        mask |= 1 << t
    return mask


def op_code(key: int, operands: tuple[int, ...]) -> bytes:
    """The 3-byte code of one op application."""
    return bytes((key, *operands, *([NO_OPERAND] * (2 - len(operands)))))


def _family_prev() -> list[int | None]:
    prev: list[int | None] = []
    last: dict[str, int] = {}
    for i, (_, fam, _, _) in enumerate(INPUTS):
        prev.append(last.get(fam))
        last[fam] = i
    return prev


FAMILY_PREV = _family_prev()
WEIGHT_INPUT = tuple(kind == "const" for _, _, kind, _ in INPUTS)


#: A tensor's kind as the operand typing sees it: (shape, whether it is a weight).
Kind = tuple[tuple[int, ...], bool]
#: What an application accepting operands of some kinds gives: (attributes, output shapes, all operands weights).
Accepted = tuple[Attrs, list[tuple[int, ...]], bool]


def operands_typed(op: str, kinds: tuple[Kind, ...]) -> bool:
    """TASO's typing of operands (what ``operand_tuples`` enumerates), one tuple of kinds at a time: an image is an
    activation (not a weight) and a kernel a weight, both rank 4; a scalar operand is the scalar input and scales a
    tensor that is not one; a menu with ``same_shapes`` takes equal shapes; ``weights_only`` ops take weights
    only. The op table's shape rule decides the rest."""
    entry = OPS[op]
    no_weights = entry.role(0) == "image" or entry.menu.activations_only  # type: ignore[union-attr]
    (shape_a, weight_a), rest = kinds[0], kinds[1:]
    if entry.weights_only and not all(w for _, w in kinds):
        return False
    if not rest:
        return not (no_weights and weight_a)
    ((shape_b, weight_b),) = rest
    if entry.menu.same_shapes:  # type: ignore[union-attr]
        return not (no_weights and weight_a) and shape_a == shape_b
    roles = (entry.role(0), entry.role(1))
    if roles[1] == "scalar":
        return shape_a != () and shape_b == ()
    if roles == ("image", "kernel"):
        return len(shape_a) == 4 and not weight_a and len(shape_b) == 4 and weight_b
    return True


class KindRows:
    """Which applications of one or two operands accept which operand kinds, as arrays grown as kinds appear
    (``accepted`` per application and pair of kinds: an index into ``results``, -1 for none), so the last op's
    rows of a level are found by array operations over its tensors' kinds (``rows_of``)."""

    def __init__(self, accepted: Callable[[Application, tuple[tuple[int, ...], ...], bool],
                                          tuple[Attrs, list[tuple[int, ...]]] | None]) -> None:
        self.accepted = accepted  # (application, operand shapes, all weights) -> (attrs, output shapes) or None
        self.kinds: dict[Kind, int] = {}
        self.by_index: list[Kind] = []
        self.results: list[Accepted] = []
        self.single: list[bool] = []  # per result: one output
        self.unary = [app for app in APPLICATIONS if arity(app.op) == 1]
        self.binary = [app for app in APPLICATIONS if arity(app.op) == 2]
        self.unary_keys = np.array([app.key for app in self.unary], np.int64)
        self.binary_keys = np.array([app.key for app in self.binary], np.int64)
        self.accepted_one = np.zeros((len(self.unary), 0), np.int32)
        self.accepted_two = np.zeros((len(self.binary), 0, 0), np.int32)
        self.known = np.zeros((0, 0), bool)
        self.index_ok: dict[int, np.ndarray] = {}

    def kind(self, kind: Kind) -> int:
        """The index of a kind (a new one gets the next)."""
        found = self.kinds.get(kind)
        if found is None:
            found = self.kinds[kind] = len(self.by_index)
            self.by_index.append(kind)
            self._grow(found + 1)
            self.accepted_one[:, found] = [self._accept(app, (kind,)) for app in self.unary]
        return found

    def _grow(self, size: int) -> None:
        have = self.known.shape[0]
        if size <= have:
            return
        new = max(size, 2 * have, 16)
        self.accepted_one = np.pad(self.accepted_one, ((0, 0), (0, new - have)), constant_values=-1)
        self.accepted_two = np.pad(self.accepted_two, ((0, 0), (0, new - have), (0, new - have)), constant_values=-1)
        self.known = np.pad(self.known, ((0, new - have), (0, new - have)))

    def _accept(self, app: Application, kinds: tuple[Kind, ...]) -> int:
        if not operands_typed(app.op, kinds):
            return -1
        all_weights = all(w for _, w in kinds)
        found = self.accepted(app, tuple(shape for shape, _ in kinds), all_weights)
        if found is None:
            return -1
        attrs, out_shapes = found
        self.results.append((attrs, out_shapes, all_weights))
        self.single.append(len(out_shapes) == 1)
        return len(self.results) - 1

    def _pairs_known(self, kinds: np.ndarray) -> None:
        present = np.unique(kinds)
        if self.known[np.ix_(present, present)].all():
            return
        for a in present.tolist():
            for b in present.tolist():
                if not self.known[a, b]:
                    pair = (self.by_index[a], self.by_index[b])
                    self.accepted_two[:, a, b] = [self._accept(app, pair) for app in self.binary]
                    self.known[a, b] = True

    def _index_ok(self, n: int) -> np.ndarray:
        """Per binary application, which operand index pairs (a, b) of n tensors it may read: a commutative op
        a <= b, one constant on equal inputs a != b."""
        found = self.index_ok.get(n)
        if found is None:
            a, b = np.indices((n, n))
            found = self.index_ok[n] = np.stack([
                ((a <= b) if OPS[app.op].commutative else np.ones((n, n), bool))
                & ((a != b) if OPS[app.op].constant_on_equal_inputs else np.ones((n, n), bool))
                for app in self.binary])
        return found

    def rows_of(self, tensor_kinds: list[int]) -> LastRows:
        """The rows of every application of one or two operands over tensors of these kinds, in the walk's order
        (menu key, first operand, second)."""
        kinds = np.array(tensor_kinds, np.intp)
        self._pairs_known(kinds)
        n = len(kinds)
        two = np.where(self._index_ok(n), self.accepted_two[:, kinds[:, None], kinds[None, :]], -1)
        app2, first2, second2 = np.nonzero(two >= 0)
        one = self.accepted_one[:, kinds]
        app1, first1 = np.nonzero(one >= 0)
        keys = np.concatenate([self.binary_keys[app2], self.unary_keys[app1]])
        first = np.concatenate([first2, first1]).astype(np.int64)
        second = np.concatenate([second2, np.full(len(first1), -1)]).astype(np.int64)
        results = np.concatenate([two[app2, first2, second2], one[app1, first1]]).astype(np.int64)
        order = np.lexsort((second, first, keys))
        results = results[order]
        return LastRows.of(self.results, keys[order], first[order], second[order], results,
                            np.array(self.single, bool)[results] if len(results) else np.zeros(0, bool))


@dataclass
class LastPrefix:
    """A prefix of ``max_ops - 1`` ops queued for its last op (``enumerate_graphs``' ``kept_multisets``): its
    last-op rows (``table``, those tried at ``tried``) and the walk's state they read, copied: tensor fingerprints
    and values, open outputs, per input its readers count, per tensor its readers and producing op, per op its cone
    and first output, the ops and their code."""

    table: LastRows
    tried: np.ndarray
    fps: list[int]
    values: list[np.ndarray]
    open_outputs: list[int]
    used: list[int]
    readers: list[int]
    op_cone: list[int]
    tensor_op: list[int]
    producers: list[int]
    graph: tuple
    code: bytes


@dataclass
class LastRows:
    """The last op's candidate applications at one walk level, in the walk's order, as arrays: menu key, first and
    second operand (-1: none), the index of what the application gives (``results``: attributes, output shapes,
    all weights), whether it has one output."""

    results: list[Accepted]
    keys: np.ndarray
    first: np.ndarray
    second: np.ndarray
    result: np.ndarray
    single: np.ndarray
    code: np.ndarray  # (menu key, first + 1, second + 1) as one int64 ordered as the triple
    top: np.ndarray  # the larger operand
    key_tag: np.ndarray  # the menu key's term of ``FingerprintCache.address``

    @staticmethod
    def of(results: list[Accepted], keys: np.ndarray, first: np.ndarray, second: np.ndarray, result: np.ndarray,
           single: np.ndarray) -> LastRows:
        return LastRows(results, keys, first, second, result, single, _op_codes(keys, first, second),
                         np.maximum(first, second), key_tag(keys))

    def row(self, i: int) -> tuple[Application, tuple[int, ...], Attrs]:
        """Row ``i``'s application, operands and attributes."""
        first, second = int(self.first[i]), int(self.second[i])
        return (APPLICATIONS[int(self.keys[i])], (first,) if second < 0 else (first, second),
                self.results[int(self.result[i])][0])

    def subset(self, at: np.ndarray) -> LastRows:
        """The rows at the positions ``at`` (ascending)."""
        return LastRows(self.results, self.keys[at], self.first[at], self.second[at], self.result[at],
                         self.single[at], self.code[at], self.top[at], self.key_tag[at])

    def narrowed(self, used: np.ndarray, masks: list[int], full: int) -> LastRows:
        """The rows of one level from those of its shapes and kinds: the graph uses the inputs ``used`` (a flag
        per input), each tensor touches the components of its bit mask in ``masks``, ``full`` is all of them. A row
        must touch every component (``operand_tuples``) and take an input only after the earlier ones of its
        family, used before or its first operand (``input_order_ok``)."""
        n_in = len(used)
        n = len(masks)
        # per tensor, plus a last entry for "no operand" (-1)
        prev = np.full(n + 1, -2, np.int64)
        prev[:n_in] = [-2 if p is None else p for p in FAMILY_PREV]
        in_order = np.ones(n + 1, bool)
        in_order[:n_in] = used | (prev[:n_in] < 0) | used[np.maximum(prev[:n_in], 0)]
        touched = np.zeros(n + 1, np.int64)
        touched[:n] = masks
        first, second = self.first, self.second
        keep = (in_order[first] & (in_order[second] | (prev[second] == first))
                & ((touched[first] | touched[second]) == full))
        return self.subset(np.flatnonzero(keep))

    def reading(self, required: int, live: list[int]) -> LastRows:
        """The rows whose operands include every tensor of the bit mask ``required`` and one of each mask of
        ``live`` (``level_tuples``' narrowing, on the arrays)."""
        one = np.int64(1)
        read = (one << self.first) | np.where(self.second >= 0, one << np.maximum(self.second, 0), 0)
        keep = read & required == required
        for inner in live:
            keep &= read & inner != 0
        return self.subset(np.flatnonzero(keep))

    def tried(self, op_keys: list[tuple[int, tuple[int, ...]]], prev_first: int) -> np.ndarray:
        """Which rows the walk tries after the ops ``op_keys``, the last of which has its first output at
        ``prev_first``: an op independent of the previous one comes after it in (menu key, operands) order, and
        no op repeats one of the graph (an op of no operand is never a last op: it joins no component)."""
        codes = [_op_code_int(key, operands) for key, operands in op_keys if operands]
        skip = (self.top < prev_first) & (self.code <= _op_code_int(*op_keys[-1]))
        for code in codes:
            skip |= self.code == code
        return ~skip


def _op_code_int(key: int, operands: tuple[int, ...]) -> int:
    """An op's (menu key, operands) as ``_op_codes`` gives it."""
    first = operands[0] if operands else -1
    second = operands[1] if len(operands) > 1 else -1
    return key << 16 | (first + 1) << 8 | (second + 1)


def _op_codes(keys: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Ops as one int64 each, in the order of their (menu key, first operand, second operand; -1: none)."""
    return keys << 16 | (first + 1) << 8 | (second + 1)


_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
_TAG = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9))


def key_tag(keys: np.ndarray) -> np.ndarray:
    """The menu keys' term of ``FingerprintCache.address``."""
    with np.errstate(over="ignore"):
        return keys.astype(np.uint64) * _TAG[2]


def multiset_hash(fingerprints: np.ndarray) -> np.ndarray:
    """Each tensor fingerprint mixed (splitmix64's finalizer; 0 stays 0): the sum over a graph's outputs is
    an order-independent hash of their multiset that arrays add up, where ``graph_fp`` hashes one at a time."""
    x = fingerprints.astype(np.uint64)
    x ^= x >> np.uint64(30)
    x *= _MIX[0]
    x ^= x >> np.uint64(27)
    x *= _MIX[1]
    x ^= x >> np.uint64(31)
    return x


#: log2 of the flags in front of the kept multiset hashes (``MultisetFilter``): 64 M one-byte flags; with the
#: 2.8 M hashes of the <= 3-op graphs, about 4% of the hashes a flag lets through are not kept.
MULTISET_FILTER_BITS = 26


@dataclass(frozen=True)
class MultisetFilter:
    """The kept multiset hashes (``kept``) and a flag per value of a hash's top ``MULTISET_FILTER_BITS`` bits
    (``flags``): whether a kept hash has them. The flags settle most of the last op's rows in one array lookup, a
    binary search the rest: in a third of the memory of a Python set of the hashes, and without a Python step per
    row."""

    kept: SortedFingerprints
    flags: np.ndarray

    @staticmethod
    def of(hashes: np.ndarray) -> MultisetFilter:
        """The filter of ``hashes`` (sorted and unique)."""
        flags = np.zeros(1 << MULTISET_FILTER_BITS, dtype=bool)
        flags[hashes >> np.uint64(64 - MULTISET_FILTER_BITS)] = True
        return MultisetFilter(SortedFingerprints(hashes), flags)

    def members(self, hashes: np.ndarray) -> np.ndarray:
        """The positions of ``hashes`` (uint64) that are kept hashes, ascending."""
        at = np.flatnonzero(self.flags[hashes >> np.uint64(64 - MULTISET_FILTER_BITS)])
        return at[self.kept.members(hashes[at])]


def output_multisets(outs: np.ndarray) -> np.ndarray:
    """The sorted multiset hashes of graphs given as rows of output fingerprints padded with 0 (``pack``'s
    ``outs``): ``enumerate_graphs``' ``kept_multisets``."""
    return np.unique(multiset_hash(outs).sum(axis=1, dtype=np.uint64))


@dataclass(frozen=True)
class FingerprintCache:
    """The fingerprints of op outputs by (menu key, operand fingerprints), direct-mapped: ``tags`` and ``values``
    hold ``2**bits`` slots, each the latest entry whose 64-bit tag (a hash of the key) falls in it, so the rows of
    a prefix are looked up and stored by a few array operations, and a miss is computed again."""

    tags: np.ndarray
    values: np.ndarray

    @staticmethod
    def of(bits: int) -> FingerprintCache:
        """An empty cache of ``2**bits`` slots (a tag is never 0)."""
        return FingerprintCache(np.zeros(1 << bits, np.uint64), np.zeros(1 << bits, np.uint64))

    def address(self, key_tags: np.ndarray, first_fps: np.ndarray, second_fps: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        """The tags and slots of the keys: menu keys (as ``key_tag``) and operand fingerprints (0 for no second
        operand)."""
        with np.errstate(over="ignore"):
            mixed = first_fps * _TAG[0] + second_fps * _TAG[1] + key_tags
        tags = multiset_hash(mixed) | np.uint64(1)
        shift = np.uint64(64 - (len(self.tags).bit_length() - 1))
        return tags, (tags >> shift).astype(np.intp) if shift < 64 else np.zeros(len(tags), np.intp)

    def store(self, tags: np.ndarray, slots: np.ndarray, values: np.ndarray, rows: np.ndarray) -> None:
        """Store ``values`` of the ``rows`` given by their index into ``tags``/``slots``."""
        self.tags[slots[rows]] = tags[rows]
        self.values[slots[rows]] = values[rows]


@dataclass(frozen=True)
class SortedFingerprints:
    """A set of 64-bit fingerprints as one sorted array of them (``values``, unique uint64): membership by binary
    search, in a tenth of the memory of a Python set of millions."""

    values: np.ndarray

    def __contains__(self, fingerprint: object) -> bool:
        return isinstance(fingerprint, int) and self.position(fingerprint) is not None

    def position(self, fingerprint: int) -> int | None:
        """The index of ``fingerprint`` in ``values``, or None when it is not in the set."""
        if not 0 <= fingerprint < 1 << 64:
            return None
        values = self.values
        at = int(values.searchsorted(np.uint64(fingerprint)))  # the method: np.searchsorted's dispatch costs as much
        return at if at < len(values) and int(values[at]) == fingerprint else None

    def members(self, fingerprints: np.ndarray) -> np.ndarray:
        """Which of ``fingerprints`` (uint64) are in the set, as a boolean array."""
        if not len(self.values) or not len(fingerprints):
            return np.zeros(len(fingerprints), dtype=bool)
        found = np.minimum(self.values.searchsorted(fingerprints), len(self.values) - 1)
        return self.values[found] == fingerprints


@dataclass(frozen=True)
class FirstCodes:
    """Per tensor a single-output graph computes (``tensors``): the fewest ops computing it (``ops``) and the
    smallest code of a graph of that many ops computing it (``codes``: rows of 3 bytes an op, ``NO_OPERAND``-padded),
    so one graph of each tensor is the canonical one."""

    tensors: SortedFingerprints
    ops: np.ndarray
    codes: np.ndarray

    def code_of(self, fingerprint: int, size: int) -> bytes | None:
        """The canonical code of the tensor when its fewest ops are ``size``, else None."""
        at = self.tensors.position(fingerprint)
        if at is None or int(self.ops[at]) != size:
            return None
        return self.codes[at, :3 * size].tobytes()

"""TASO's pruning of candidate pairs: input renaming and common subgraphs.

* Input renaming: two pairs that differ only by a renaming of inputs within a family (x1 <-> x2, ...)
  are one substitution; the key is the smallest text over all renamings.
* Common subgraphs: a pair is dropped when
  - some output is the same expression on both sides (the pair without it is smaller), or
  - at every output both sides apply the same op (same attributes, same output slot) to operands of
    equal value: the pair is implied by the smaller pair(s) of operands ("root"), or
  - both sides contain the same subexpression T and the sides stay equal when T is replaced by a fresh
    random tensor: the more general pair with T as an input (which the enumeration also finds, having fewer
    ops, and emits shape-generic) implies it ("common").
"""

from __future__ import annotations

import functools
import zlib
from itertools import permutations, product

import numpy as np
from xflow.generator.enumerate import INPUTS, IntEvaluator, tensor_fp
from xflow.generator.fingerprint import N_IN, Entry, MemoEvaluator, Pair, expressions, match_outputs

from xflow.ops import OPS

_FAMILIES: dict[str, list[str]] = {}
for _name, _fam, _, _ in INPUTS:
    _FAMILIES.setdefault(_fam, []).append(_name)


@functools.lru_cache(maxsize=1024)
def _renamings(used: frozenset[int]) -> tuple[tuple[str, ...], ...]:
    """The input names under each renaming within families that moves a used input differently: texts name the
    used inputs only, so renamings that differ on unused ones give the same texts and are listed once."""
    names = [n for n, _, _, _ in INPUTS]
    families = [members for members in _FAMILIES.values()
                if len(members) > 1 and any(names.index(m) in used for m in members)]
    out: dict[tuple[str, ...], None] = {}
    for perms in product(*(permutations(members) for members in families)):
        mapping = {n: n for n in names}
        for members, perm in zip(families, perms, strict=True):
            mapping.update(dict(zip(members, perm, strict=True)))
        out[tuple(mapping[n] if i in used else n for i, n in enumerate(names))] = None
    return tuple(out)


def _text(entry: Entry, names: tuple[str, ...]) -> str:
    texts = expressions(entry.graph, names)
    return " ; ".join(sorted(texts[t] for t in entry.outputs))


def renaming_key(pair: Pair) -> tuple[str, str]:
    """The pair's canonical text, minimal over renamings of inputs within their families."""
    return renaming_keys(pair)[0]


def renaming_keys(pair: Pair) -> tuple[tuple[str, str], tuple[str, str]]:
    """``renaming_key`` of the pair and of the pair reversed (b -> a), from one pass over the renamings."""
    texts = [(_text(pair.a, names), _text(pair.b, names))
             for names in _renamings(pair.a.inputs_used | pair.b.inputs_used)]
    return min(texts), min((b, a) for a, b in texts)


def _producers(entry: Entry) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    t = N_IN
    for i, (op, attrs, _) in enumerate(entry.graph):
        for k in range(OPS[op].num_outputs(attrs)):
            out[t] = (i, k)
            t += 1
    return out


#: Most fresh tensors a ``CommonSubgraph`` keeps (then it starts over): 128 bytes to 1.5 KB each.
FRESH_TENSORS = 50_000


class CommonSubgraph:
    """Decides the common-subgraph pruning of pairs on the seeded int inputs."""

    def __init__(self, seed: int = 0) -> None:
        self.inputs = IntEvaluator(seed).inputs
        self.seed = seed
        self.evaluator = MemoEvaluator(self.inputs, integer=True)
        # the fresh tensor of each subterm text: a few thousand texts recur in a part's pairs, and a generator
        # seeded per draw costs more than the evaluations it feeds
        self.fresh: dict[str, np.ndarray] = {}

    def reason(self, pair: Pair) -> str | None:
        """Why the pair is redundant ("root" or "common"), or None to keep it."""
        a, b = pair.a, pair.b
        mapping = match_outputs(a, b)
        if mapping is None:
            return "mismatch"
        va, ta_text = self.evaluator.values(a.graph)  # type: ignore[misc]
        vb, tb_text = self.evaluator.values(b.graph)  # type: ignore[misc]
        if any(ta_text[x] == tb_text[y] for x, y in mapping):
            return "root"  # an output both sides compute alike: the pair without it is smaller
        if self._root_implied(a, b, mapping, va, vb, ta_text, tb_text):
            return "root"
        # Any shape: the smaller pair with T as an input is found on the input shapes and emitted shape-generic,
        # so it covers T at this shape too. (Requiring an input shape let "two unchanged convs around a concat +
        # split" through at 4 ops, and 416 such context rules at 3 ops.)
        common = (set(ta_text[N_IN:]) & set(tb_text[N_IN:]))
        for text in sorted(common):
            fresh = self._fresh(text, va[ta_text.index(text)].shape)
            ga, _ = self.evaluator.values(a.graph, override={text: fresh})  # type: ignore[misc]
            gb, _ = self.evaluator.values(b.graph, override={text: fresh})  # type: ignore[misc]
            if all(tensor_fp(ga[x]) == tensor_fp(gb[y]) for x, y in mapping):
                return "common"
        return None

    def _fresh(self, text: str, shape: tuple[int, ...]) -> np.ndarray:
        """The fresh random tensor standing for the subterm ``text`` (of this shape: a text has one)."""
        found = self.fresh.get(text)
        if found is None:
            if len(self.fresh) >= FRESH_TENSORS:
                self.fresh.clear()
            info = np.iinfo(np.int64)
            # drawn from the seed and the subterm's text alone: a generator shared by the part's pairs made the
            # draw depend on the pairs before it, so the kept pairs depended on how the run was cut (--jobs)
            rng = np.random.default_rng([self.seed + 7, zlib.crc32(text.encode())])
            found = self.fresh[text] = rng.integers(info.min, info.max, size=shape, dtype=np.int64, endpoint=True)
        return found

    @staticmethod
    def _root_implied(a: Entry, b: Entry, mapping, va, vb, ta_text, tb_text) -> bool:
        pa, pb = _producers(a), _producers(b)
        for x, y in mapping:
            if ta_text[x] == tb_text[y]:
                continue
            if x not in pa or y not in pb:
                return False
            (ia, ka), (ib, kb) = pa[x], pb[y]
            opa, attrsa, insa = a.graph[ia]
            opb, attrsb, insb = b.graph[ib]
            if opa != opb or attrsa != attrsb or ka != kb or len(insa) != len(insb):
                return False
            fa = [tensor_fp(va[t]) for t in insa]
            fb = [tensor_fp(vb[t]) for t in insb]
            if OPS[opa].commutative:
                fa, fb = sorted(fa), sorted(fb)
            if fa != fb:
                return False
        return True

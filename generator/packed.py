"""Generated candidates kept compressed until a task needs them.

A candidate is a JSON dict of every variant's nodes, attributes and provenance: about 25 KB of Python objects for
a ≤ 4-op one, 5 KB of JSON text and 0.5 KB of zstd-compressed JSON. A generation run holds all of them in one
process (tens of thousands at 3 ops, a million or more at 4), so the workers that emit them pack each one with the
few fields the parent's dedupe reads, and the parent unpacks a candidate only when a task is built from it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import zstandard

# zstd rather than zlib: at level 3 a ≤ 4-op candidate compresses in 12 µs against zlib's 56 µs at level 6 (a
# million of them are packed at 4 ops) and decompresses in 6.5 µs against 10, 4% larger. Reused: one of each per
# process (a worker packs, the parent unpacks), never shared between threads.
_COMPRESSOR = zstandard.ZstdCompressor(level=3)
_DECOMPRESSOR = zstandard.ZstdDecompressor()


@dataclass(frozen=True)
class PackedRule:
    """One emitted rule: its ``name``, dedupe ``key`` and constant slots (``consts``), and the rule itself as
    zstd-compressed JSON (``blob``)."""

    name: str
    key: str
    consts: frozenset[str]
    blob: bytes


def pack(rule: dict[str, Any], key: str, consts: frozenset[str]) -> PackedRule:
    """``rule`` packed with the dedupe fields the caller computed for it."""
    # ``json.dumps``' own text (no cycle check: faster, the same bytes), so that the candidate file is written
    # from the blobs without decoding and encoding each rule again (a minute in one process at 4 ops); compact
    # separators would save 2% of the compressed size
    text = json.dumps(rule, check_circular=False)
    return PackedRule(rule["name"], key, consts, _COMPRESSOR.compress(text.encode()))


def unpack(blob: bytes) -> dict[str, Any]:
    """The rule dict a ``PackedRule.blob`` holds."""
    return json.loads(_DECOMPRESSOR.decompress(blob))


class PackedRules(Sequence[dict[str, Any]]):
    """A read-only sequence of rule dicts stored compressed: each access unpacks a fresh dict."""

    def __init__(self, blobs: Sequence[bytes]) -> None:
        self._blobs = list(blobs)

    def __len__(self) -> int:
        return len(self._blobs)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> PackedRules: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | PackedRules:
        if isinstance(index, slice):
            return PackedRules(self._blobs[index])
        return unpack(self._blobs[index])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (unpack(b) for b in self._blobs)

    def texts(self) -> Iterator[str]:
        """Each rule as the JSON text ``json.dumps`` gives for it, without decoding it."""
        return (_DECOMPRESSOR.decompress(b).decode() for b in self._blobs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedRules):
            return self._blobs == other._blobs
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-equality semantics, like a list

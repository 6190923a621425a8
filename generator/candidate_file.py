"""The candidate file: generated, unverified candidates on disk (``xflow generate-rules --save-candidates``), read
back by ``--candidates`` to redo or extend a long run's verification.

``{"format": "xflow.candidates/1", "max_ops": N, "seed": S, "candidates": [...]}``, each candidate a JSON rule with
its ``"variants"``. The generator's in-memory packed form (``generator.packed``) is not this format: it is how the
workers hand candidates to the parent, and it is written out here as the JSON text it holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from xflow.generator.packed import PackedRules

from xflow.errors import XflowError
from xflow.files import write_atomically

CANDIDATES_FORMAT = "xflow.candidates/1"


def save_candidates(path: str, candidates: Iterable[dict[str, Any]], max_ops: int, seed: int) -> None:
    """Write generated (unverified) candidates for a later ``--candidates`` run, atomically."""
    def dump(tmp: str) -> None:
        # one candidate at a time (the generator's are packed: all of them as dicts would not fit at 4 ops); the
        # bytes json.dump gives for the whole object, each candidate through ``json.dumps``, whose C encoder is
        # several times ``json.dump``'s Python one (a million candidates, 4.6 GB, at 4 ops); packed ones hold
        # that text already
        texts = candidates.texts() if isinstance(candidates, PackedRules) else map(json.dumps, candidates)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"format": CANDIDATES_FORMAT, "max_ops": max_ops, "seed": seed})[:-1]
                    + ', "candidates": [')
            for i, text in enumerate(texts):
                if i:
                    f.write(", ")
                f.write(text)
            f.write("]}")

    write_atomically(path, dump)


def load_candidates(path: str, max_ops: int) -> list[dict[str, Any]]:
    """The candidates ``save_candidates`` wrote; XflowError naming the file when it is not such a file or
    holds candidates of another size."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise XflowError(path, f"cannot read candidates ({e})") from None
    if not isinstance(data, dict) or data.get("format") != CANDIDATES_FORMAT:
        raise XflowError(path, "not a candidate file written by --save-candidates")
    if data.get("max_ops") != max_ops:
        raise XflowError(path, f"candidates of {data.get('max_ops')} ops; pass --max-ops {data.get('max_ops')}")
    return list(data["candidates"])

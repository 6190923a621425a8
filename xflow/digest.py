"""Content digests of arrays and of a run's inputs, where a certificate states a value and a record keys it."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np


def array_hash(array: np.ndarray) -> str:
    """sha256 of an array's bytes in C order, without copying a contiguous one (a merged weight can be hundreds
    of MB)."""
    contiguous = np.ascontiguousarray(array)
    if contiguous.dtype.hasobject:
        return hashlib.sha256(contiguous.tobytes()).hexdigest()
    return hashlib.sha256(contiguous.reshape(-1).view(np.uint8)).hexdigest()


def feeds_digest(feeds: Mapping[str, np.ndarray]) -> str:
    """The inputs a run is given: each one's name, dtype, shape and bytes (so the seed, ``--inputs`` and the profile
    point are all in it)."""
    digest = hashlib.blake2b(digest_size=20)
    for name in sorted(feeds):
        array = np.ascontiguousarray(feeds[name])
        digest.update(repr((name, array.dtype.str, array.shape)).encode())
        digest.update(array.reshape(-1).view(np.uint8) if not array.dtype.hasobject else array.tobytes())
    return digest.hexdigest()

"""TASO-style substitution generator: enumerate small operator graphs, fingerprint, prune, emit xflow rules.

``generate(max_ops, seed, jobs, progress) -> GenerationResult(rules, table)``; ``python -m generator.run``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GenerationResult", "generate"]


def __getattr__(name: str) -> Any:  # lazy, so ``python -m generator.run`` imports run.py only once
    if name in __all__:
        from generator import run

        return getattr(run, name)
    raise AttributeError(name)

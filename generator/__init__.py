"""TASO-style substitution generator: enumerate small operator graphs, fingerprint, prune, emit xflow rules.

``generate(max_ops, seed, jobs, progress) -> GenerationResult(rules, table)``; the whole pipeline (generate,
verify, write the rule file) is ``xflow.generator.pipeline``, the candidate file ``xflow.generator.candidate_file``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GenerationResult", "generate"]


def __getattr__(name: str) -> Any:  # lazy: importing a submodule does not import run.py's numpy and executor
    if name in __all__:
        from xflow.generator import run

        return getattr(run, name)
    raise AttributeError(name)

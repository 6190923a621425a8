"""Proving a user's rule file before ``xflow optimize`` uses it: every rule that carries no proof
(``xflow.rules.proof``) is checked numerically (a counterexample refutes a false rule in milliseconds) and then
proved with z3 within a small budget; a rule neither settles is refused by name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from xflow.verifier.batch import ESCALATION, verify_candidate

from xflow.errors import XflowError
from xflow.rules import Rule
from xflow.rules.proof import unproved, with_proof_digest

#: z3 resource units a user's rule may spend (verify-rules' second round; the shipped rules' median is 25k).
USER_RULE_RLIMIT = ESCALATION[1]
#: The wall-clock guard of each proof, a last resort (the budget is in resource units).
USER_RULE_GUARD_S = 30.0


def prove_unproved(rules: Sequence[Rule], path: str, rlimit: int = USER_RULE_RLIMIT, seed: int = 0,
                   guard_s: float = USER_RULE_GUARD_S) -> tuple[list[Rule], int]:
    """``rules`` with a proof for each that carried none (its provenance filled in and the proof's content
    digest recorded), and how many were proved here. XflowError naming ``path`` and every rule that could not be
    proved (refuted by the numeric check or z3, or left unknown within ``rlimit``), with the first's reason."""
    todo = {id(rule) for rule in unproved(rules)}
    if not todo:
        return list(rules), 0
    proved: list[Rule] = []
    refused: list[tuple[str, str, str]] = []
    for rule in rules:
        if id(rule) not in todo:
            proved.append(rule)
            continue
        outcome = verify_candidate(rule.to_json(), rlimit=rlimit, seed=seed, guard_s=guard_s)
        if outcome.status != "proved" or outcome.rule is None:
            refused.append((rule.name, outcome.status, outcome.reason))
            continue
        proved.append(replace(rule, provenance=with_proof_digest(outcome.rule["provenance"], rule)))
    if refused:
        name, status, reason = refused[0]
        more = ", ".join(n for n, _, _ in refused[1:])
        others = f" (and {len(refused) - 1} more: {more})" if more else ""
        reason = " ".join(reason.split()).removeprefix(f"{status}: ")
        raise XflowError(path, f"rule {name!r} carries no proof and cannot be proved ({status}: {reason}){others}; "
                               "a rule without a proof is not used (xflow verify-rules shows each rule's answer)")
    return proved, len(todo)

"""The axioms relevant to one rule: those E-matching could ever instantiate from the rule's terms.

z3 instantiates an axiom by E-matching when a term of one of its trigger patterns exists. A rule's terms
apply only the ops of its two sides, and an instantiated axiom adds the ops of its own two sides; so the
axioms whose triggers become available in that closure are all E-matching can use, and the others only
slow the search down. Keyed by op-table names (``Axiom.ops`` / ``Axiom.triggers``, derived from the axioms'
terms), never by z3 symbol names; a variadic op's by name and arity (``axioms.op_key``), as z3's functions are.

A subset of the axioms can only lose proofs: a proof from some axioms is a proof from all of them. It can
however make a false "refuted" (a model of the subset need not be a model of every axiom), so the prover
retries a subset's refutation with every axiom before reporting it.
"""

from __future__ import annotations

from collections.abc import Iterable

from xflow.verifier.axioms import AXIOMS, Axiom, op_key

from xflow.rules.model import Rule


def rule_ops(rule: Rule) -> frozenset[str]:
    """The ops applied on either side of ``rule``, by ``op_key`` (a variadic op with its arity)."""
    return frozenset(op_key(node.op, len(node.inputs)) for node in (*rule.src, *rule.dst))


def relevant_axioms(ops: Iterable[str], axioms: tuple[Axiom, ...] = AXIOMS) -> tuple[Axiom, ...]:
    """The axioms (in their given order) whose triggers are reachable from terms over ``ops``: an axiom joins
    when every op of one of its trigger patterns is available, and makes the ops of its two sides available."""
    available = set(ops)
    chosen: set[str] = set()
    grown = True
    while grown:
        grown = False
        for axiom in axioms:
            if axiom.name not in chosen and any(trigger <= available for trigger in axiom.triggers):
                chosen.add(axiom.name)
                available |= axiom.ops
                grown = True
    return tuple(a for a in axioms if a.name in chosen)


def axioms_for(rule: Rule, axioms: tuple[Axiom, ...] = AXIOMS) -> tuple[Axiom, ...]:
    """The axioms relevant to ``rule`` (see the module docstring)."""
    return relevant_axioms(rule_ops(rule), axioms)

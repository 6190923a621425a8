"""Whether a rule carries a proof: the verifier's record in its provenance, for the rule as it is written.

A rule proved by the verifier has ``provenance.z3.status == "proved"`` and a ``provenance.numeric`` record (the
shipped files, ``generate-rules``, ``verify-rules``). A proof made for a user's rule file before it is used
(``verifier.user_rules``) also records ``provenance.proof.digest``, the digest of the rule's content; a rule whose
recorded digest differs from its content was edited after it was proved and carries no proof.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from xflow.errors import XflowError
from xflow.rules.model import Rule

#: The fields that say what a rule computes (its name, doc and provenance do not).
CONTENT_FIELDS = ("inputs", "src", "dst", "outputs", "where")


def content_digest(rule: Rule | Mapping[str, Any]) -> str:
    """A digest of what the rule computes: its inputs, patterns, output map and conditions."""
    raw = rule.to_json() if isinstance(rule, Rule) else rule
    content = {k: raw.get(k, [] if k == "where" else None) for k in CONTENT_FIELDS}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def has_proof(rule: Rule) -> bool:
    """True when the rule's provenance records a z3 proof and a numeric check, for this content."""
    provenance = rule.provenance
    z3 = provenance.get("z3") if isinstance(provenance, Mapping) else None
    if not isinstance(z3, Mapping) or z3.get("status") != "proved" or not isinstance(provenance.get("numeric"),
                                                                                  Mapping):
        return False
    proof = provenance.get("proof")
    if proof is None:
        return True
    return isinstance(proof, Mapping) and proof.get("digest") == content_digest(rule)


def has_stale_proof(rule: Rule) -> bool:
    """True when the rule records a proof made for other content (it was edited after it was proved)."""
    proof = rule.provenance.get("proof") if isinstance(rule.provenance, Mapping) else None
    return isinstance(proof, Mapping) and proof.get("digest") != content_digest(rule)


def refuse_stale_proofs(rules: Iterable[Rule], path: str) -> None:
    """XflowError naming ``path`` and the first rule whose recorded proof is for other content: the library
    takes a file's rules as they are, but never one whose own record says its proof is not for it."""
    stale = [rule.name for rule in rules if has_stale_proof(rule)]
    if stale:
        raise XflowError(path, f"rule {stale[0]!r} was edited after it was proved (its proof digest is for other "
                               f"content{f'; {len(stale) - 1} more' if len(stale) > 1 else ''}); prove it again "
                               "(xflow optimize --rules proves it before use)")


def unproved(rules: Iterable[Rule]) -> list[Rule]:
    """The rules that carry no proof (``has_proof``), in order."""
    return [rule for rule in rules if not has_proof(rule)]


def with_proof_digest(provenance: Mapping[str, Any], rule: Rule | Mapping[str, Any]) -> dict[str, Any]:
    """``provenance`` with ``proof.digest`` set to the rule's content digest (recorded when a proof is made)."""
    return {**provenance, "proof": {"digest": content_digest(rule)}}

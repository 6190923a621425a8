"""TASO-style rule verifier: z3 axioms over the op table, rule encoding, proofs and numeric checks."""

from verifier.axioms import AXIOMS, Axiom, axiom_formulas
from verifier.consistency import ConsistencyResult, check_consistency
from verifier.encode import EncodedRule, Unsupported, encode_rule
from verifier.numeric import NumericResult, numeric_check
from verifier.prove import ProofResult, VerifyResult, prove_rule, verify_rule

__all__ = ["AXIOMS", "Axiom", "ConsistencyResult", "EncodedRule", "NumericResult", "ProofResult", "Unsupported",
           "VerifyResult", "axiom_formulas", "check_consistency", "encode_rule", "numeric_check", "prove_rule",
           "verify_rule"]

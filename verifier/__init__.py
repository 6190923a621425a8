"""TASO-style rule verifier: z3 axioms over the op table, rule encoding, proofs and numeric checks."""

from xflow.verifier.axioms import AXIOMS, Axiom, axiom_formulas
from xflow.verifier.consistency import ConsistencyResult, check_consistency
from xflow.verifier.encode import EncodedRule, Unsupported, encode_rule
from xflow.verifier.numeric import NumericResult, numeric_check
from xflow.verifier.prove import ProofResult, VerifyResult, prove_rule, verify_rule

__all__ = ["AXIOMS", "Axiom", "ConsistencyResult", "EncodedRule", "NumericResult", "ProofResult", "Unsupported",
           "VerifyResult", "axiom_formulas", "check_consistency", "encode_rule", "numeric_check", "prove_rule",
           "verify_rule"]

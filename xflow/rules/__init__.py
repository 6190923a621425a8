"""Substitution rules as data: the format, its checks, and rule files."""

from xflow.rules.expr import Expr, ExprError, ShapeEnv
from xflow.rules.io import FORMAT, default_rules_path, dump_rules, load_rules, rules_from_json
from xflow.rules.model import PatternNode, Rule, RuleError, Var, parse_rule, validate

__all__ = ["Expr", "ExprError", "FORMAT", "PatternNode", "Rule", "RuleError", "ShapeEnv", "Var",
           "default_rules_path", "dump_rules", "load_rules", "parse_rule", "rules_from_json", "validate"]

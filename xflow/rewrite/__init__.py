"""Matching rules in graphs and applying them."""

from xflow.rewrite.apply import Change, apply_match, plan_match
from xflow.rewrite.fold import fold_constants
from xflow.rewrite.match import Match, MatchTracer, RuleIndex, find_matches, instantiate_target

__all__ = ["Change", "Match", "MatchTracer", "RuleIndex", "apply_match", "fold_constants", "find_matches",
           "instantiate_target", "plan_match"]

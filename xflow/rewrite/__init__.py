"""Matching rules in graphs and applying them."""

from xflow.rewrite.apply import Change, apply_match, plan_match
from xflow.rewrite.fold import fold_constants
from xflow.rewrite.match import (
    FailureKind,
    Match,
    MatchFailure,
    MatchStatus,
    MatchTracer,
    RuleIndex,
    find_matches,
    instantiate_target,
)

__all__ = ["Change", "FailureKind", "Match", "MatchFailure", "MatchStatus", "MatchTracer", "RuleIndex", "apply_match",
           "find_matches", "fold_constants", "instantiate_target", "plan_match"]

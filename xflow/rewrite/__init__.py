"""Matching rules in graphs and applying them."""

from xflow.rewrite.apply import apply_match
from xflow.rewrite.fold import fold_constants
from xflow.rewrite.match import Match, MatchTracer, find_matches, instantiate_target

__all__ = ["Match", "MatchTracer", "apply_match", "fold_constants", "find_matches", "instantiate_target"]

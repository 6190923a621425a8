"""Cost-based search over rule applications."""

from xflow.search.backtrack import SearchResult, Step, backtracking_search

__all__ = ["SearchResult", "Step", "backtracking_search"]

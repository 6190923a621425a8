"""Cost-based search over rule applications."""

from xflow.search.backtrack import Alternative, SearchResult, Step, backtracking_search, complete_sweeps

__all__ = ["Alternative", "SearchResult", "Step", "backtracking_search", "complete_sweeps"]

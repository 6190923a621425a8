"""Cost-based search over rule applications."""

from xflow.search.backtrack import (
                                    Alternative,
                                    SearchLimits,
                                    SearchReport,
                                    Step,
                                    StopReason,
                                    backtracking_search,
                                    complete_sweeps,
)

__all__ = ["Alternative", "SearchLimits", "SearchReport", "Step", "StopReason", "backtracking_search",
           "complete_sweeps"]

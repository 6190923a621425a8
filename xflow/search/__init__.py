"""Cost-based search over rule applications."""

from xflow.search.backtrack import (
                                    Branch,
                                    SearchLimits,
                                    SearchReport,
                                    Step,
                                    StopReason,
                                    backtracking_search,
                                    complete_sweeps,
)

__all__ = ["Branch", "SearchLimits", "SearchReport", "Step", "StopReason", "backtracking_search",
           "complete_sweeps"]

"""What a run decided to write, as data: a ``Decision`` and its reason."""

from __future__ import annotations

from enum import Enum

from xflow.runtime import NON_INFERIORITY_MARGIN


class Decision(Enum):
    """What the run wrote: the optimized model (``OPTIMIZED``: measured faster, or written as asked;
    ``SIMPLER_NOT_SLOWER``: fewer nodes or bytes and not slower), or the original and why (``reason``, the words
    the report and the CLI use)."""

    OPTIMIZED = "optimized"
    SIMPLER_NOT_SLOWER = "simpler-not-slower"
    NO_RULES = "no-rules"
    NO_REWRITE = "no-rewrite"
    CANNOT_RUN = "cannot-run"
    NOT_FINITE = "outputs-not-finite"
    NOT_EQUIVALENT_AT_OTHER_SIZES = "not-equivalent-at-other-sizes"
    NOT_FASTER = "kept-original-not-faster"
    NOT_FASTER_AT_EVERY_POINT = "kept-original-not-faster-at-every-point"

    @property
    def reason(self) -> str:
        """Why, in words."""
        return _REASONS[self]

    @property
    def writes_optimized(self) -> bool:
        """True when the optimized model is the one written."""
        return self in (Decision.OPTIMIZED, Decision.SIMPLER_NOT_SLOWER)

    def describe(self, copied: bool) -> str:
        """The report's ``decision``: "optimized", "simpler, not slower", or how the original was written and why."""
        if self is Decision.OPTIMIZED:
            return "optimized"
        if self is Decision.SIMPLER_NOT_SLOWER:
            return "simpler, not slower"
        return f"{'copied' if copied else 'original re-encoded'} ({self.reason})"


_REASONS = {
    Decision.OPTIMIZED: "optimized: measured faster at every profile point (or written as --keep-if-slower asks, "
                        "or not timed)",
    Decision.SIMPLER_NOT_SLOWER: f"fewer nodes or bytes, and not slower: at most {NON_INFERIORITY_MARGIN:.0%} slower "
                                 "at every profile point (one-sided signed-rank test over the session pairs)",
    Decision.NO_RULES: "no rules",
    Decision.NO_REWRITE: "no improving rewrite",
    Decision.CANNOT_RUN: "ONNX Runtime cannot run the model",
    Decision.NOT_FINITE: "outputs not finite on any inputs tried",
    Decision.NOT_EQUIVALENT_AT_OTHER_SIZES: "optimized model not equivalent at other sizes",
    Decision.NOT_FASTER: "optimized model was not faster",
    Decision.NOT_FASTER_AT_EVERY_POINT: "optimized model was not faster at every profile point",
}

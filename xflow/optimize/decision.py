"""What a run decided to write, as data: a ``Decision`` and its reason."""

from __future__ import annotations

from enum import Enum


class Decision(Enum):
    """What the run wrote: the optimized model, or the original and why (``reason``, the words the report and the
    CLI use)."""

    OPTIMIZED = "optimized"
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

    def describe(self, copied: bool) -> str:
        """The report's ``decision``: "optimized", or how the original was written and why."""
        if self is Decision.OPTIMIZED:
            return self.reason
        return f"{'copied' if copied else 'original re-encoded'} ({self.reason})"


_REASONS = {
    Decision.OPTIMIZED: "optimized",
    Decision.NO_RULES: "no rules",
    Decision.NO_REWRITE: "no improving rewrite",
    Decision.CANNOT_RUN: "ONNX Runtime cannot run the model",
    Decision.NOT_FINITE: "outputs not finite on any inputs tried",
    Decision.NOT_EQUIVALENT_AT_OTHER_SIZES: "optimized model not equivalent at other sizes",
    Decision.NOT_FASTER: "optimized model was not faster",
    Decision.NOT_FASTER_AT_EVERY_POINT: "optimized model was not faster at every profile point",
}

"""What the verifier can say of a rule or candidate: one value of ``OutcomeStatus``.

The values are the words the files and reports have always held (``"proved"``, ``"refuted"`` ...): a ``StrEnum``
member is its word in JSON, in f-strings and in comparisons, so the rule files and ``verify-rules``' lines written
with it are byte for byte those written with the words.
"""

from __future__ import annotations

from enum import StrEnum


class OutcomeStatus(StrEnum):
    """A proof attempt's or a candidate's status; only ``PROVED`` means the rule follows from the axioms."""

    PROVED = "proved"
    REFUTED = "refuted"  # a countermodel of the axioms (z3) or a numeric counterexample
    UNKNOWN = "unknown"  # the z3 budget ran out or z3 gave up: the same answer on any machine
    TIMEOUT = "timeout"  # the wall-clock guard stopped z3: depends on the machine and its load
    UNSUPPORTED = "unsupported"  # the rule cannot be encoded
    UNCHECKED = "unchecked"  # too few valid numeric instances to check it
    MALFORMED = "malformed"  # the variant does not parse

    @classmethod
    def of_line(cls, line: str) -> OutcomeStatus:
        """The status a ``"status: reason"`` line of an outcome's ``statuses`` starts with."""
        return cls(line.split(":", 1)[0])


#: The statuses in the order a candidate no variant of which is proved takes the first found among its variants'
#: (a load-dependent timeout first: it must be visible as such).
WORST_FIRST = (OutcomeStatus.TIMEOUT, OutcomeStatus.UNKNOWN, OutcomeStatus.REFUTED, OutcomeStatus.UNSUPPORTED,
               OutcomeStatus.UNCHECKED, OutcomeStatus.MALFORMED)
#: The statuses the generation table counts, in its order.
TABLE_ORDER = (OutcomeStatus.PROVED, OutcomeStatus.REFUTED, OutcomeStatus.UNKNOWN, OutcomeStatus.TIMEOUT,
               OutcomeStatus.UNSUPPORTED, OutcomeStatus.UNCHECKED)

"""What a user can set for one optimization, in groups, and ``DEFAULTS``: the one place a default is written.

The CLI's option defaults, ``xflow.bench.BenchSettings`` and the search read their defaults from here (the
search's own, ``SearchLimits``, are this object's ``search`` group)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xflow.ort import Sessions
from xflow.rules import Rule
from xflow.search import SearchLimits


@dataclass(frozen=True)
class RuntimeSettings:
    """Where ONNX Runtime runs: the execution provider and its intra-op threads (None: every core)."""

    provider: str = "cpu"
    threads: int | None = None

    def sessions(self, scratch: str | None = None) -> Sessions:
        """The run's maker of sessions, its scratch folder ``scratch``."""
        return Sessions(self.provider, self.threads, scratch)


@dataclass(frozen=True)
class CostSettings:
    """The search's cost model: ``measured`` (ORT, cached in the SQLite file ``db``; None: the user's cache folder)
    or ``analytic``."""

    kind: str = "measured"
    db: str | None = None


@dataclass(frozen=True)
class InputSettings:
    """The inputs the model is measured, checked and timed on: shapes for dynamic inputs (measuring only), the
    sizes of its dynamic dims (``xflow.onnx_io.shape_profile``), the user's arrays, or random ones of ``seed``."""

    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    profile: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    npz: str | None = None
    seed: int = 0

    @property
    def label(self) -> str:
        """How messages name the inputs."""
        return "--inputs" if self.npz else f"seed {self.seed}"


@dataclass(frozen=True)
class CheckSettings:
    """What is checked before writing: outputs against the original (``verify``), the end-to-end timing
    (``measure``), whether a model not measured faster is written all the same (``keep_if_slower``), and whether a
    simpler model (fewer nodes or bytes) must be measured faster too, not only not slower (``require_faster``)."""

    verify: bool = True
    measure: bool = True
    keep_if_slower: bool = False
    require_faster: bool = False


@dataclass(frozen=True)
class OutputSettings:
    """What the written model carries besides the graph: its certificate (``xflow.check``), unless ``certificate``
    is False; ``certificate_path`` also writes it alone there. ``replay``: a certificate (or a model carrying one)
    whose steps are applied instead of searching and measuring."""

    certificate: bool = True
    certificate_path: str | None = None
    replay: str | None = None


@dataclass(frozen=True)
class OptimizeOptions:
    """Everything a user can set for one optimization (``rules_path`` None: the shipped rules)."""

    rules_path: str | None = None
    rules: Sequence[Rule] | None = None  # the rules already loaded (and proved) by the caller; rules_path names them
    search: SearchLimits = field(default_factory=SearchLimits)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    cost: CostSettings = field(default_factory=CostSettings)
    inputs: InputSettings = field(default_factory=InputSettings)
    checks: CheckSettings = field(default_factory=CheckSettings)
    output: OutputSettings = field(default_factory=OutputSettings)

    @classmethod
    def of(cls, **fields: Any) -> OptimizeOptions:
        """Options from the flat names ``xflow.optimize`` takes (``FLAT_NAMES``: ``budget``, ``provider``,
        ``cost_db``, ...), the defaults for the others; TypeError naming an unknown one."""
        unknown = sorted(set(fields) - set(FLAT_NAMES))
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(FLAT_NAMES))}")
        groups: dict[str, dict[str, Any]] = {}
        for name, value in fields.items():
            group, attribute = FLAT_NAMES[name]
            groups.setdefault(group, {})[attribute] = value
        top = groups.pop("", {})
        grouped = {group: dataclasses.replace(getattr(DEFAULTS, group), **values) for group, values in groups.items()}
        return cls(top.get("rules_path"), top.get("rules"), **grouped)


#: The flat option names of ``xflow.optimize`` (and ``OptimizeOptions.of``): name -> (group, field).
FLAT_NAMES: dict[str, tuple[str, str]] = {
    "rules_path": ("", "rules_path"), "rules": ("", "rules"),
    "alpha": ("search", "alpha"), "budget": ("search", "budget"), "patience": ("search", "patience"),
    "branches": ("search", "branches"), "time_limit": ("search", "time_limit"),
    "memory_limit": ("search", "memory_limit_mb"),
    "provider": ("runtime", "provider"), "threads": ("runtime", "threads"),
    "cost": ("cost", "kind"), "cost_db": ("cost", "db"),
    "input_shapes": ("inputs", "shapes"), "shape_profile": ("inputs", "profile"), "inputs_npz": ("inputs", "npz"),
    "seed": ("inputs", "seed"),
    "keep_if_slower": ("checks", "keep_if_slower"),
    "require_faster": ("checks", "require_faster"), "measure": ("checks", "measure"), "verify": ("checks", "verify"),
    "certificate": ("output", "certificate"), "certificate_path": ("output", "certificate_path"),
    "replay": ("output", "replay"),
}

#: Every default of ``xflow optimize``, written once.
DEFAULTS = OptimizeOptions()

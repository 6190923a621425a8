"""Devices and links: the machine a placement is planned for, from JSON or a built-in name."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from xflow.errors import XflowError

DEVICE_KINDS = ("cpu", "cuda")


@dataclass(frozen=True)
class Device:
    """One device. ``memory`` is bytes (0 = unlimited) or, when ``memory_fraction`` is set, that
    fraction of the placed model's peak memory on one device (so one built-in can force a split on
    every model).
    ``speed`` divides the cost model's node times; ``op_speed`` overrides it per op; ``overhead`` is
    seconds added to every node run there (kernel launch); ``threads`` is for CPU devices in the
    executor; ``unsupported`` lists ops (IR op names or ONNX types) the device cannot run."""

    name: str
    kind: str = "cpu"
    memory: float = 0.0
    memory_fraction: float = 0.0
    speed: float = 1.0
    op_speed: dict[str, float] = field(default_factory=dict)
    overhead: float = 0.0
    threads: int = 1
    unsupported: frozenset[str] = frozenset()

    def capacity(self, footprint: float) -> float:
        """Memory capacity in bytes for a model that needs ``footprint`` bytes on one device (inf = none)."""
        if self.memory_fraction > 0:
            return self.memory_fraction * footprint
        return self.memory if self.memory > 0 else float("inf")

    def supports(self, op: str) -> bool:
        """True unless ``op`` is listed as unsupported."""
        return op not in self.unsupported


@dataclass(frozen=True)
class Link:
    """A directed link: a transfer of ``b`` bytes takes ``latency + b / bandwidth`` seconds."""

    latency: float
    bandwidth: float

    def seconds(self, nbytes: float) -> float:
        """Time to move ``nbytes`` over this link."""
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class Topology:
    """Devices (index 0 holds the graph inputs) and links between them (``default_link`` where a
    pair is not listed). Links are serial: one transfer at a time per ordered pair."""

    name: str
    devices: tuple[Device, ...]
    links: dict[tuple[int, int], Link]
    default_link: Link

    def link(self, src: int, dst: int) -> Link:
        """The link from device ``src`` to ``dst``."""
        return self.links.get((src, dst), self.default_link)

    @property
    def names(self) -> list[str]:
        """Device names in order."""
        return [d.name for d in self.devices]

    def index(self, name: str) -> int:
        """The index of device ``name``."""
        for i, d in enumerate(self.devices):
            if d.name == name:
                return i
        raise KeyError(name)

    def to_json(self) -> dict:
        """The JSON form that ``topology_from_json`` reads."""
        devices = []
        for d in self.devices:
            entry: dict = {"name": d.name, "kind": d.kind, "speed": d.speed, "overhead": d.overhead,
                           "threads": d.threads}
            if d.memory_fraction:
                entry["memory_fraction"] = d.memory_fraction
            elif d.memory:
                entry["memory"] = d.memory
            if d.op_speed:
                entry["op_speed"] = dict(d.op_speed)
            if d.unsupported:
                entry["unsupported"] = sorted(d.unsupported)
            devices.append(entry)
        links = [{"from": self.devices[a].name, "to": self.devices[b].name, "latency": lk.latency,
                  "bandwidth": lk.bandwidth} for (a, b), lk in sorted(self.links.items())]
        return {"name": self.name, "devices": devices, "links": links,
                "default_link": {"latency": self.default_link.latency, "bandwidth": self.default_link.bandwidth}}


MIN_MEMORY = 1 << 20  # bytes: a device memory below 1 MiB is a unit mistake, not a device
MAX_THREADS = max(1024, os.cpu_count() or 1)  # a CPU device's thread pool; more is a typo, not a machine
MAX_OVERHEAD = 1.0  # seconds per node run: a kernel launch takes microseconds
DEVICE_FIELDS = ("name", "kind", "memory", "memory_fraction", "speed", "op_speed", "overhead", "threads",
                 "unsupported")
LINK_FIELDS = ("from", "to", "latency", "bandwidth", "bidirectional")
TOPOLOGY_FIELDS = ("name", "devices", "links", "default_link")


class FieldProblems:
    """Problems found in one JSON input file (a topology, a calibration), each a short phrase; reported
    together on one line."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, problem: str) -> None:
        self.found.append(problem)

    def fields(self, raw: dict, known: tuple[str, ...], where: str) -> None:
        """Report keys of ``raw`` that are not in ``known`` (a misspelt field would be silently ignored)."""
        for key in raw:
            if key not in known:
                self.add(f"{where}: unknown field {key!r} (known: {', '.join(known)})")

    def number(self, raw: dict, key: str, default: float, where: str, low: float = 0.0, strict: bool = False,
               high: float = float("inf"), integer: bool = False) -> float:
        """``raw[key]`` as a finite number within [low, high] (``strict``: above ``low``), else ``default``
        and a problem."""
        value = raw.get(key, default)
        bound = f"> {low:g}" if strict else f">= {low:g}"
        kind = "an integer" if integer else "a finite number"
        wanted = f"{kind} {bound}" + (f" and <= {high:g}" if high < float("inf") else "")
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
            and (value > low if strict else value >= low) and value <= high \
            and (not integer or float(value).is_integer())
        if not ok:
            self.add(f"{where}: {key} must be {wanted} (got {value!r})")
            return default
        return float(value)

    def raise_if_any(self, source: str, what: str = "topology") -> None:
        """XflowError naming ``source`` with the first three problems, when there are any."""
        if self.found:
            more = f" (and {len(self.found) - 3} more)" if len(self.found) > 3 else ""
            raise XflowError(source, f"malformed {what}: {'; '.join(self.found[:3])}{more}")


def topology_from_json(data: object, source: str = "topology") -> Topology:
    """Build a topology from its JSON form; XflowError naming ``source`` and every problem (one line) when a
    field is unknown, a quantity not finite, or not positive where the physics requires it."""
    problems = FieldProblems()
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list) or not data["devices"]:
        problems.add("needs a non-empty list 'devices'")
        problems.raise_if_any(source)
    assert isinstance(data, dict)
    problems.fields(data, TOPOLOGY_FIELDS, "topology")
    devices = [_read_device(raw, i, problems) for i, raw in enumerate(data["devices"])]
    names = [d.name for d in devices]
    if len(set(names)) != len(names):
        problems.add("device names must be unique")
    default = _read_link(data.get("default_link", {"latency": 1e-5, "bandwidth": 1e10}), "default_link", problems)
    links: dict[tuple[int, int], Link] = {}
    raw_links = data.get("links", [])
    if not isinstance(raw_links, list):
        problems.add("'links' must be a list")
        raw_links = []
    for raw in raw_links:
        if not isinstance(raw, dict) or raw.get("from") not in names or raw.get("to") not in names:
            problems.add(f"link {raw!r} must name two known devices in 'from' and 'to'")
            continue
        where = f"link {raw['from']}->{raw['to']}"
        if raw["from"] == raw["to"]:
            problems.add(f"{where}: a link joins two different devices")
        link = _read_link(raw, where, problems, LINK_FIELDS)
        if not isinstance(raw.get("bidirectional", True), bool):
            problems.add(f"{where}: bidirectional must be true or false")
        links[(names.index(raw["from"]), names.index(raw["to"]))] = link
        if raw.get("bidirectional", True):
            links.setdefault((names.index(raw["to"]), names.index(raw["from"])), link)
    name = data.get("name", source)
    if not isinstance(name, str) or not name:
        problems.add("name must be a non-empty string")
    problems.raise_if_any(source)
    return Topology(str(name), tuple(devices), links, default)


def _read_device(raw: object, i: int, problems: FieldProblems) -> Device:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        problems.add(f"device {i} needs a non-empty string 'name'")
        return Device(name=f"#{i}")
    where = f"device {raw['name']!r}"
    problems.fields(raw, DEVICE_FIELDS, where)
    kind = raw.get("kind", "cpu")
    if kind not in DEVICE_KINDS:
        problems.add(f"{where} has kind {kind!r}; choose one of {', '.join(DEVICE_KINDS)}")
    memory = problems.number(raw, "memory", 0.0, where)
    if 0 < memory < MIN_MEMORY:
        problems.add(f"{where}: memory is in bytes (0 = unlimited) and at least {MIN_MEMORY} (got {memory:g})")
    fraction = problems.number(raw, "memory_fraction", 0.0, where)
    if 0 < fraction < 0.01:
        problems.add(f"{where}: memory_fraction is a share of the model's peak, at least 0.01 (got {fraction:g})")
    if memory and fraction:
        problems.add(f"{where}: give memory or memory_fraction, not both")
    op_speed = raw.get("op_speed", {})
    if not isinstance(op_speed, dict):
        problems.add(f"{where}: op_speed must map op names to speeds")
        op_speed = {}
    unsupported = raw.get("unsupported", [])
    if not isinstance(unsupported, list) or not all(isinstance(o, str) for o in unsupported):
        problems.add(f"{where}: unsupported must be a list of op names")
        unsupported = []
    return Device(name=raw["name"], kind=str(kind), memory=memory, memory_fraction=fraction,
                  speed=problems.number(raw, "speed", 1.0, where, strict=True),
                  op_speed={str(k): problems.number(op_speed, k, 1.0, f"{where} op_speed", strict=True)
                            for k in op_speed},
                  overhead=problems.number(raw, "overhead", 0.0, where, high=MAX_OVERHEAD),
                  threads=int(problems.number(raw, "threads", 1, where, low=1, high=MAX_THREADS, integer=True)),
                  unsupported=frozenset(unsupported))


def _read_link(raw: object, where: str, problems: FieldProblems,
               known: tuple[str, ...] = ("latency", "bandwidth")) -> Link:
    if not isinstance(raw, dict):
        problems.add(f"{where} must be an object with latency (s) and bandwidth (bytes/s)")
        return Link(0.0, 1.0)
    problems.fields(raw, known, where)
    if "bandwidth" not in raw:
        problems.add(f"{where} needs 'bandwidth' (bytes/s)")
        return Link(0.0, 1.0)
    return Link(problems.number(raw, "latency", 0.0, where, high=MAX_OVERHEAD),
                problems.number(raw, "bandwidth", 1.0, where, strict=True))


def _gpus(count: int, name: str, bandwidth: float, latency: float, **device: object) -> dict:
    host = {"name": "cpu", "kind": "cpu", "speed": 1.0, "threads": 2}
    gpus = [{"name": f"gpu{i}", "kind": "cuda", "speed": 8.0, "overhead": 8e-6, **device} for i in range(count)]
    return {"name": name, "devices": [host, *gpus],
            "default_link": {"latency": latency, "bandwidth": bandwidth},
            "links": [{"from": "cpu", "to": f"gpu{i}", "latency": 2 * latency, "bandwidth": bandwidth / 2}
                      for i in range(count)]}


BUILTINS: dict[str, dict] = {
    # This machine: its cores split between two CPU "devices" (half the cores each); moving a tensor
    # between them is an in-process hand-over.
    "cpu": {"name": "cpu", "devices": [{"name": "cpu0", "kind": "cpu", "threads": 1},
                                        {"name": "cpu1", "kind": "cpu", "threads": 1}],
            "default_link": {"latency": 2e-5, "bandwidth": 5e9}},
    "cpu+cuda": {"name": "cpu+cuda", "devices": [{"name": "cpu", "kind": "cpu", "threads": 0},
                                                  {"name": "cuda0", "kind": "cuda", "speed": 10.0,
                                                   "overhead": 1e-5}],
                 "default_link": {"latency": 1e-5, "bandwidth": 1.2e10}},
    "4xgpu-pcie": _gpus(4, "4xgpu-pcie", bandwidth=1.2e10, latency=1e-5),
    # Each GPU holds only 60% of the model's single-device peak (weights + live activations): one GPU
    # cannot hold the model, a split is required.
    "2xgpu-memcap": _gpus(2, "2xgpu-memcap", bandwidth=1.2e10, latency=1e-5, memory_fraction=0.6),
    "8xgpu-nvlink": _gpus(8, "8xgpu-nvlink", bandwidth=1.5e11, latency=3e-6),
}
BUILTINS["cpu+cuda"]["devices"][0]["threads"] = os.cpu_count() or 1
for _device in BUILTINS["cpu"]["devices"]:
    _device["threads"] = max(1, (os.cpu_count() or 2) // 2)


def load_topology(spec: str) -> Topology:
    """A built-in topology by name, or a JSON file by path; XflowError on unknown names or bad files."""
    if spec in BUILTINS:
        return topology_from_json(BUILTINS[spec], spec)
    if not os.path.exists(spec):
        raise XflowError(spec, f"no such topology file or built-in; built-ins: {', '.join(BUILTINS)}")
    return topology_from_json(read_json(spec, "topology"), spec)


def read_json(path: str, what: str) -> object:
    """Parse a JSON file; XflowError naming the file (``what`` it should be) when missing or malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise XflowError(path, f"no such {what} file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise XflowError(path, f"cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise XflowError(path, f"malformed {what}: not JSON ({exc.msg} at line {exc.lineno})") from None

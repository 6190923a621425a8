"""Devices and links: the machine a placement is planned for, from JSON or a built-in name."""

from __future__ import annotations

import json
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


def topology_from_json(data: dict, source: str = "topology") -> Topology:
    """Build a topology from its JSON form; raises XflowError naming ``source`` on malformed input."""

    def bad(problem: str) -> XflowError:
        return XflowError(source, f"malformed topology: {problem}")

    if not isinstance(data, dict) or not isinstance(data.get("devices"), list) or not data["devices"]:
        raise bad("needs a non-empty list 'devices'")
    devices: list[Device] = []
    for i, raw in enumerate(data["devices"]):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise bad(f"device {i} needs a string 'name'")
        kind = raw.get("kind", "cpu")
        if kind not in DEVICE_KINDS:
            raise bad(f"device {raw['name']!r} has kind {kind!r}; choose one of {', '.join(DEVICE_KINDS)}")
        try:
            device = Device(name=raw["name"], kind=kind, memory=float(raw.get("memory", 0)),
                            memory_fraction=float(raw.get("memory_fraction", 0)), speed=float(raw.get("speed", 1)),
                            op_speed={str(k): float(v) for k, v in raw.get("op_speed", {}).items()},
                            overhead=float(raw.get("overhead", 0)), threads=int(raw.get("threads", 1)),
                            unsupported=frozenset(str(o) for o in raw.get("unsupported", [])))
        except (TypeError, ValueError, AttributeError) as exc:
            raise bad(f"device {raw['name']!r}: {exc}") from None
        if device.speed <= 0 or device.threads < 1 or device.memory < 0 or device.memory_fraction < 0:
            raise bad(f"device {raw['name']!r}: speed and threads must be positive, memory not negative")
        devices.append(device)
    names = [d.name for d in devices]
    if len(set(names)) != len(names):
        raise bad("device names must be unique")
    default = _link(data.get("default_link", {"latency": 1e-5, "bandwidth": 1e10}), bad, "default_link")
    links: dict[tuple[int, int], Link] = {}
    for raw in data.get("links", []):
        if not isinstance(raw, dict) or raw.get("from") not in names or raw.get("to") not in names:
            raise bad(f"link {raw!r} must name two known devices in 'from' and 'to'")
        link = _link(raw, bad, f"link {raw['from']}->{raw['to']}")
        links[(names.index(raw["from"]), names.index(raw["to"]))] = link
        if raw.get("bidirectional", True):
            links.setdefault((names.index(raw["to"]), names.index(raw["from"])), link)
    return Topology(str(data.get("name", source)), tuple(devices), links, default)


def _link(raw: object, bad, where: str) -> Link:  # noqa: ANN001 - error factory
    if not isinstance(raw, dict):
        raise bad(f"{where} must be an object with latency and bandwidth")
    try:
        link = Link(float(raw.get("latency", 0)), float(raw["bandwidth"]))
    except (KeyError, TypeError, ValueError):
        raise bad(f"{where} needs numeric 'latency' (s) and 'bandwidth' (bytes/s)") from None
    if link.latency < 0 or link.bandwidth <= 0:
        raise bad(f"{where}: latency must be >= 0 and bandwidth > 0")
    return link


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

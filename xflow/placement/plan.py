"""Plans on disk: JSON (node -> device, step times, baselines) and device metadata on ONNX nodes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import onnx

from xflow.errors import XflowError
from xflow.onnx_io import to_model_proto
from xflow.placement.problem import Problem
from xflow.placement.topology import Topology, read_json, topology_from_json

PLAN_FORMAT = "xflow-plan/1"
DEVICE_KEY = "xflow.device"  # ONNX node metadata_props key holding the device name


@dataclass
class Plan:
    """A placement with everything a report needs. ``placement`` maps node keys (a node's first output
    name) to device names; ``seconds`` is the chosen placement's step time in ``env``."""

    model: str
    topology: Topology
    env: str
    placement: dict[str, str]
    seconds: float
    chosen: str
    baselines: dict[str, float] = field(default_factory=dict)
    rl: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The JSON form written by ``xflow place``."""
        return {"format": PLAN_FORMAT, "model": self.model, "topology": self.topology.to_json(), "env": self.env,
                "step_seconds": self.seconds, "chosen": self.chosen, "baselines": self.baselines, "rl": self.rl,
                **self.extra, "placement": self.placement}

    def devices_for(self, problem: Problem, source: str = "plan") -> list[int]:
        """Device index per node of ``problem``; XflowError when the plan does not fit the graph: a node
        without a device, an entry for a node the graph does not have, or a device its topology lacks."""
        missing = [k for k in problem.keys if k not in self.placement]
        if missing:
            raise XflowError(source, f"plan does not match the model: no device for {len(missing)} node(s), "
                                     f"e.g. {missing[0]!r}")
        known = set(problem.keys)
        extra = [k for k in self.placement if k not in known]
        if extra:
            raise XflowError(source, f"plan does not match the model: it places {len(extra)} node(s) the model "
                                     f"does not have, e.g. {extra[0]!r}")
        names = self.topology.names
        try:
            return [names.index(self.placement[k]) for k in problem.keys]
        except ValueError:
            bad = next(self.placement[k] for k in problem.keys if self.placement[k] not in names)
            raise XflowError(source, f"plan names device {bad!r}, which its topology lacks") from None


def make_plan(model: str, problem: Problem, topology: Topology, env: str, devices: Sequence[int], seconds: float,
              chosen: str, **kwargs: object) -> Plan:
    """A Plan from device indexes per node."""
    placement = {k: topology.devices[d].name for k, d in zip(problem.keys, devices, strict=True)}
    return Plan(model, topology, env, placement, seconds, chosen, **kwargs)  # type: ignore[arg-type]


def read_plan(path: str) -> Plan:
    """Read a plan JSON file; XflowError naming the file and the problem when it is not a plan, its topology
    is malformed, a node is placed on a device the topology lacks, or a time is not a finite number >= 0."""
    data = read_json(path, "plan")
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT or not isinstance(data.get("placement"), dict):
        raise XflowError(path, f"malformed plan: expected format {PLAN_FORMAT!r} with a 'placement' object")
    topology = topology_from_json(data.get("topology"), path)
    names = set(topology.names)
    unknown = sorted({str(v) for v in data["placement"].values() if not isinstance(v, str) or v not in names})
    if unknown:
        raise XflowError(path, f"malformed plan: placement names device(s) {', '.join(map(repr, unknown[:3]))} "
                               f"that its topology ({', '.join(topology.names)}) lacks")
    baselines = data.get("baselines", {})
    if not isinstance(baselines, dict):
        raise XflowError(path, "malformed plan: 'baselines' must map names to seconds")
    times = {"step_seconds": data.get("step_seconds", 0.0), **{f"baselines[{k!r}]": v for k, v in baselines.items()}}
    for where, value in times.items():
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise XflowError(path, f"malformed plan: {where} must be a finite number of seconds >= 0 (got {value!r})")
    rl = data.get("rl", {})
    if not isinstance(rl, dict):
        raise XflowError(path, "malformed plan: 'rl' must be an object")
    known = {"format", "model", "topology", "env", "step_seconds", "chosen", "baselines", "rl", "placement"}
    return Plan(str(data.get("model", "")), topology, str(data.get("env", "")),
                {str(k): v for k, v in data["placement"].items()}, float(times["step_seconds"]),
                str(data.get("chosen", "")), {k: float(v) for k, v in baselines.items()}, rl,
                {k: v for k, v in data.items() if k not in known})


def annotate_model(problem: Problem, plan: Plan) -> onnx.ModelProto:
    """The graph as ONNX with each node's device in its metadata (``xflow.device``)."""
    model = to_model_proto(problem.graph)
    by_value: dict[str, str] = {}
    for node in problem.graph.nodes:
        key = next((o for o in node.outputs if o), None)
        if key is not None and key in plan.placement:
            for o in node.outputs:
                if o:
                    by_value[o] = plan.placement[key]
    for proto in model.graph.node:
        device = next((by_value[o] for o in proto.output if o in by_value), None)
        if device is None:
            continue
        for entry in proto.metadata_props:
            if entry.key == DEVICE_KEY:
                entry.value = device
                break
        else:
            proto.metadata_props.add(key=DEVICE_KEY, value=device)
    return model

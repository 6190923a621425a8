"""Plans on disk: JSON (node -> device, step times, baselines) and device metadata on ONNX nodes."""

from __future__ import annotations

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
        """Device index per node of ``problem``; XflowError when the plan does not fit the graph."""
        missing = [k for k in problem.keys if k not in self.placement]
        if missing:
            raise XflowError(source, f"plan does not match the model: no device for {len(missing)} node(s), "
                                     f"e.g. {missing[0]!r}")
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
    """Read a plan JSON file; XflowError naming the file on any problem."""
    data = read_json(path, "plan")
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT or not isinstance(data.get("placement"), dict):
        raise XflowError(path, f"malformed plan: expected format {PLAN_FORMAT!r} with a 'placement' object")
    topology = topology_from_json(data.get("topology"), path)
    known = {"format", "model", "topology", "env", "step_seconds", "chosen", "baselines", "rl", "placement"}
    return Plan(str(data.get("model", "")), topology, str(data.get("env", "")),
                {str(k): str(v) for k, v in data["placement"].items()}, float(data.get("step_seconds", 0.0)),
                str(data.get("chosen", "")), dict(data.get("baselines", {})), dict(data.get("rl", {})),
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

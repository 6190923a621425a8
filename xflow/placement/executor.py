"""The real environment: a placed graph cut into per-device segments, one ORT session each, run for real."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import onnx

from xflow.errors import XflowError
from xflow.ir import Graph
from xflow.onnx_io import to_model_proto
from xflow.ort import Sessions
from xflow.placement.problem import Problem
from xflow.placement.segments import segment_order
from xflow.placement.topology import Topology
from xflow.runtime import random_feeds


@dataclass(frozen=True)
class Segment:
    """Consecutive nodes (in the execution order) on one device, run as one ORT session."""

    device: int
    nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def make_segments(problem: Problem, plan: Sequence[int]) -> list[Segment]:
    """Cut the graph into per-device segments along ``segment_order``; each lists the values it reads
    from earlier segments or graph inputs and the values later segments or the graph outputs need."""
    order = segment_order(problem, plan)
    runs: list[list[int]] = []
    for u in order:
        if runs and plan[runs[-1][0]] == plan[u]:
            runs[-1].append(u)
        else:
            runs.append([u])
    segment_of = {u: i for i, run in enumerate(runs) for u in run}
    graph = problem.graph
    segments = []
    for i, run in enumerate(runs):
        members = set(run)
        inputs: dict[str, None] = {}
        outputs: dict[str, None] = {}
        for u in run:
            for t in problem.inputs_of[u]:
                tensor = problem.tensors[t]
                if tensor.producer not in members:
                    inputs[tensor.name] = None
            for t in problem.outputs_of[u]:
                tensor = problem.tensors[t]
                if tensor.is_output or any(segment_of[c] != i for c in tensor.consumers):
                    outputs[tensor.name] = None
        member_nodes = {id(graph.nodes[u]) for u in run}
        for u in run:  # values that subgraphs capture are inputs too
            for name in graph.nodes[u].implicit:
                if name not in graph.constants and id(graph.producers.get(name)) not in member_nodes:
                    inputs[name] = None
        segments.append(Segment(plan[run[0]], tuple(run), tuple(inputs), tuple(outputs)))
    return segments


def segment_model(graph: Graph, segment: Segment) -> onnx.ModelProto:
    """An ONNX model of one segment: its nodes, the weights they read, its inputs and outputs."""
    sub = Graph(tuple(graph.nodes[u] for u in segment.nodes), segment.inputs, segment.outputs, graph.types,
                graph.constants, graph.context)
    model = to_model_proto(sub)
    del model.graph.input[:]
    del model.graph.output[:]
    for names, field in ((segment.inputs, model.graph.input), (segment.outputs, model.graph.output)):
        for name in names:
            t = graph.types.get(name)
            if t is None:
                raise XflowError(graph.context.path if graph.context else None,
                                 f"value {name!r} has no known type; cannot cut the graph there")
            shape = None if t.shape is None else [d if isinstance(d, int) else None for d in t.shape]
            field.append(onnx.helper.make_tensor_value_info(name, t.dtype, shape))
    return model


def can_run(topology: Topology) -> bool:
    """Whether this machine can run ``topology`` for real: every device a CPU, or CUDA where it works."""
    kinds = {d.kind for d in topology.devices}
    return kinds <= {"cpu"} or (kinds <= {"cpu", "cuda"} and cuda_available())


def cuda_available() -> bool:
    """True when onnxruntime can really run a CUDA session here (a tiny probe, not the provider list)."""
    try:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return False
        x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
        y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
        graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
        model.ir_version = 8
        sess = _session(model, "cuda", 1)
        sess.run(None, {"x": np.ones(1, np.float32)})
        return "CUDAExecutionProvider" in sess.get_providers()
    except Exception:  # any failure means: no usable GPU
        return False


def _session(model: onnx.ModelProto, kind: str, threads: int):  # noqa: ANN202 - ort type
    if kind == "cpu":
        return Sessions("cpu", threads).open(model)
    return Sessions("cuda", threads).open(model, config={"session.disable_cpu_ep_fallback": "1"}, cpu_fallback=False)


@dataclass(frozen=True)
class Measurement:
    """A measured placement: median step time, every timed run, segment count, worst output error."""

    seconds: float
    times: tuple[float, ...]
    segments: int
    max_abs_diff: float


@dataclass(frozen=True)
class _Placed:
    """A placement ready to time: its segments, one session each, and the worst output difference seen."""

    segments: list[Segment]
    sessions: list
    max_abs_diff: float


def require_runnable(topology: Topology, source: str, used: Iterable[int] | None = None) -> None:
    """XflowError naming ``source`` (the topology, or the plan file that holds it) when a device of it (of
    ``used``, the indices a plan places nodes on, when given) is a CUDA device and onnxruntime cannot run CUDA."""
    devices = topology.devices if used is None else [topology.devices[i] for i in sorted(set(used))]
    cuda = [d.name for d in devices if d.kind == "cuda"]
    if cuda and not cuda_available():
        raise XflowError(source, f"places nodes on CUDA device(s) {', '.join(cuda)}, but onnxruntime cannot run "
                                 "CUDA here; plan for a topology of this machine's devices" if used is not None
                         else "has CUDA devices but onnxruntime cannot run CUDA here")


class Executor:
    """Runs placements for real (``runtime(plan) -> seconds``): per-device segments as ORT sessions,
    each device a worker thread that runs its segments in order as soon as their inputs exist. CPU
    devices get ``threads`` intra-op threads each; CUDA devices run with CPU fallback disabled.
    Outputs are checked against the unplaced model once per placement. Workers are not pinned to cores:
    on a shared machine a pinned worker waits for its one core while another core idles."""

    def __init__(self, problem: Problem, topology: Topology, runs: int = 10, warmup: int = 2, seed: int = 0,
                 feeds: Mapping[str, np.ndarray] | None = None, tolerance: float = 1e-3) -> None:
        self.problem = problem
        self.topology = topology
        self.runs, self.warmup, self.tolerance = runs, warmup, tolerance
        require_runnable(topology, topology.name)
        model = to_model_proto(problem.graph)
        reference = Sessions("cpu").open(model)
        self.feeds = dict(feeds) if feeds is not None else random_feeds(reference, seed)
        names = [o.name for o in reference.get_outputs()]
        self.reference = dict(zip(names, reference.run(None, self.feeds), strict=True))
        self._pool = ThreadPoolExecutor(max_workers=len(topology.devices))

    def runtime(self, plan: Sequence[int]) -> float:
        """Median measured step time of ``plan`` in seconds."""
        return self.measure(plan).seconds

    def measure(self, plan: Sequence[int]) -> Measurement:
        """Build the segment sessions, check outputs, time ``runs`` runs after ``warmup``."""
        placed = self._prepare(plan)
        times = [self._time_once(placed) for _ in range(self.runs)]
        return Measurement(statistics.median(times), tuple(times), len(placed.segments), placed.max_abs_diff)

    def measure_interleaved(self, plans: Sequence[Sequence[int]], rounds: int, seed: int = 0) -> list[Measurement]:
        """Measure several placements against each other: ``rounds`` rounds, each timing every placement
        ``runs`` times in a shuffled order; a placement's time is the median of its per-round medians
        (``times`` holds those). A change of load on the machine then hits every placement in the same
        round alike instead of whichever placement was being timed when it came, so the ranking is steadier
        than timing one placement after another."""
        placed = [self._prepare(p) for p in plans]
        per_round: list[list[float]] = [[] for _ in plans]
        order = np.arange(len(plans))
        rng = np.random.default_rng(seed)
        for _ in range(rounds):
            rng.shuffle(order)
            for i in order:
                per_round[i].append(statistics.median(self._time_once(placed[i]) for _ in range(self.runs)))
        return [Measurement(statistics.median(r), tuple(r), len(p.segments), p.max_abs_diff)
                for r, p in zip(per_round, placed, strict=True)]

    def _prepare(self, plan: Sequence[int]) -> _Placed:
        """Segment sessions for ``plan``, outputs checked against the unplaced model, ``warmup`` runs done."""
        segments = make_segments(self.problem, plan)
        sessions = [_session(segment_model(self.problem.graph, s), self.topology.devices[s.device].kind,
                             max(1, self.topology.devices[s.device].threads)) for s in segments]
        values = self._run_once(segments, sessions)
        worst = 0.0
        for name, expected in self.reference.items():
            got = values[name]
            diff = float(np.max(np.abs(got.astype(np.float64) - expected))) if expected.size else 0.0
            if not np.allclose(got, expected, rtol=self.tolerance, atol=self.tolerance):
                raise XflowError(name, f"placed model computes a different output (max abs diff {diff:.3g})")
            worst = max(worst, diff)
        for _ in range(max(self.warmup - 1, 0)):
            self._run_once(segments, sessions)
        return _Placed(segments, sessions, worst)

    def _time_once(self, placed: _Placed) -> float:
        started = time.perf_counter()
        self._run_once(placed.segments, placed.sessions)
        return time.perf_counter() - started

    def _run_once(self, segments: list[Segment], sessions: list) -> dict[str, np.ndarray]:
        values: dict[str, np.ndarray] = dict(self.feeds)
        ready = {name: threading.Event() for s in segments for name in s.outputs}
        by_device: dict[int, list[int]] = {}
        for i, s in enumerate(segments):
            by_device.setdefault(s.device, []).append(i)

        def work(indexes: list[int]) -> None:
            try:
                for i in indexes:
                    seg = segments[i]
                    for name in seg.inputs:
                        if name in ready:
                            ready[name].wait()
                    results = sessions[i].run(list(seg.outputs), {n: values[n] for n in seg.inputs})
                    for name, value in zip(seg.outputs, results, strict=True):
                        values[name] = value
                        ready[name].set()
            except BaseException:
                for event in ready.values():  # let the other devices stop waiting (they fail too)
                    event.set()
                raise

        futures = [self._pool.submit(work, idx) for idx in by_device.values()]
        for f in futures:
            f.result()
        return values

    def close(self) -> None:
        """Stop the worker threads."""
        self._pool.shutdown()

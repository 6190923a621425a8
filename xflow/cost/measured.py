"""Node costs measured with ONNX Runtime, many nodes per session, cached in SQLite.

Every group not yet in the cache (a node, or a head with the epilogues ORT fuses into it: see
``fusion``) becomes a subgraph with inputs of its own (constant inputs as initializers, as the real
model has them); up to a few hundred such subgraphs form one model, which runs a few times in one ORT
session with profiling on (same provider, threads and session options as the final run). Each group's
cost is the median over the timed runs of the summed kernel times ORT reports for its subgraph, so a
fused Conv+BatchNormalization+Relu costs what the fused kernel takes. Op-table nodes are written with
the op table's encoder, opaque nodes from their original proto.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import os
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from xflow.cost.analytic import AnalyticCost
from xflow.cost.base import group_key, is_folded, node_key
from xflow.cost.cache import CostCache
from xflow.ir import Graph, Node
from xflow.onnx_io.save import import_node_domains
from xflow.ops import OPS
from xflow.ort import Profiling, Sessions

_EVENT = re.compile(r"^xf(\d+)[nov]")
_VALUE = re.compile(r"^xf(\d+)[ov]")
#: ONNX types in a group that ORT may fuse into a node it names afresh (SkipLayerNormFusion names its node
#: "SkipLayerNormalization..."), or around which its fusion inserts nodes (MatMulAddFusion puts a Reshape
#: before and after the Gemm it makes of a batched MatMul + Add): a batch holding one is saved as ORT
#: optimized it, to find which subgraph such a node belongs to by the values it reads and writes (see
#: ``_renamed_nodes``)
RENAMED_BY_ORT = frozenset({"LayerNormalization", "MatMul"})
#: the fused kernels ORT makes that the op table knows (com.microsoft ops): renamed nodes counted
_FUSED_TYPES = frozenset(t for entry in OPS.values() if entry.domain for t in entry.onnx_types)
#: the nodes MatMulAddFusion inserts around its Gemm (``graph.GenerateNodeName("gemm_input_reshape")``):
#: the output one copies the whole product in the real model too, a cost of the fusion
_FUSION_RESHAPES = re.compile(r"^gemm_(input|output)_reshape")
#: how measured costs are attributed; part of every cache key, so costs measured before a change are not mixed
#: with costs measured after it
ATTRIBUTION = 2
MAX_BATCH_NODES = 300
MAX_BATCH_BYTES = 512 << 20  # initializer + input bytes per measuring model (protobuf stays far below 2 GB)
IN_CACHE_RUNS_FACTOR = 3  # timed runs per session when measuring in the cache, times ``runs``
REFERENCES = 6  # groups re-measured in every later session to put its costs on the first one's scale
_REF = "ref:"


@dataclass
class MeasureStats:
    """What measuring cost so far: cache hits, nodes measured, sessions built, seconds spent."""

    cache_hits: int = 0
    cache_misses: int = 0
    measured: int = 0
    sessions: int = 0
    seconds: float = 0.0
    fallback: int = 0  # nodes that cannot be measured alone (dynamic shapes, subgraphs) -> analytic
    failed: int = 0  # nodes ORT refused to run alone -> analytic
    session_factors: list[float] = field(default_factory=list)  # each later session's speed vs the first


def describe_cpu(cpuinfo: str) -> str:
    """The first CPU of a ``/proc/cpuinfo`` text: model name, family/model/stepping and widest vector ISA.

    A VM's brand string alone ("AMD EPYC") names different CPU generations alike, and costs measured on one are
    wrong on another (a host without AVX-512, or one that takes a microcode assist on float denormals), so the
    cost cache's key must tell them apart. Empty when the text names no CPU."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough: a VM's CPUs are alike
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name.strip().lower(), value.strip())
    brand = fields.get("model name") or fields.get("cpu model") or fields.get("hardware", "")
    if not brand:
        return ""
    ident = [f"{label} {fields[key]}" for key, label in (("cpu family", "family"), ("model", "model"),
                                                          ("stepping", "stepping"), ("cpu part", "part"))
             if fields.get(key)]
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    isa = next((name for name in ("avx512f", "avx2", "avx", "sve", "asimd") if name in flags), "")
    extra = ", ".join([*ident, *([isa] if isa else [])])
    return f"{brand} ({extra})" if extra else brand


def device_name(provider: str) -> str:
    """A name for the device costs are measured on (the CPU as ``describe_cpu`` gives it, or the GPU's name)."""
    if provider == "cuda":
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=10, check=True).stdout.strip().splitlines()
            return out[0] if out else "cuda"
        except (OSError, subprocess.SubprocessError):
            return "cuda"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            described = describe_cpu(f.read())
        if described:
            return described
    except OSError:
        pass
    return platform.processor() or platform.machine()


class _BatchEncoder:
    """The EncodeContext an op-table encoder sees while one node of a batch is written."""

    def __init__(self, opset: int, prefix: str, constants: dict[str, np.ndarray]) -> None:
        self.opset = opset
        self.prefix = prefix
        self.constants = constants
        self.count = 0

    def fresh_name(self, hint: str) -> str:
        self.count += 1
        return f"{self.prefix}v{self.count}"

    def add_constant(self, array: np.ndarray, hint: str) -> str:
        name = self.fresh_name(hint)
        self.constants[name] = array
        return name


@dataclass
class _Batch:
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    nbytes: int


class MeasuredCost:
    """Costs measured with ONNX Runtime on ``provider`` (see the module doc); implements CostModel."""

    name = "measured"

    def __init__(self, sessions: Sessions | None = None, cache: CostCache | None = None,
                 warmup: int = 3, runs: int = 10, seed: int = 0, batch_bytes: int | None = None) -> None:
        import onnxruntime as ort

        self.sessions = sessions if sessions is not None else Sessions()
        provider = self.provider = self.sessions.provider
        self.threads = self.sessions.thread_count
        self.cache = cache
        self.warmup = warmup
        self.runs = runs
        self.rng = np.random.default_rng(seed)
        self.fallback = AnalyticCost()
        self.stats = MeasureStats()
        # (key, graph, group, cost) of groups whose cost is known on the scale of the first session
        self.references: list[tuple[str, Graph, tuple[Node, ...], float]] = []
        self.env = (f"{provider}|{device_name(provider)}|ort {ort.__version__}|{self.threads} threads"
                    f"|attribution {ATTRIBUTION}")
        # With ``batch_bytes`` (in-cache measuring, see ``in_cache_batch_bytes``) every measuring model,
        # references included, reads at most that many bytes, so each run finds its weights in the cache
        # again, as the runs of a model that fits in the cache do. Costs so measured are cached apart.
        self.batch_bytes = batch_bytes or MAX_BATCH_BYTES
        self.in_cache = batch_bytes is not None
        if self.in_cache:
            self.env += f"|in cache {batch_bytes >> 10} KiB"
            # small batches of short kernels (tens of us): cheap to time more often, and noisier per run
            self.runs = runs * IN_CACHE_RUNS_FACTOR

    # ---- the CostModel interface --------------------------------------------------------------------
    fuses = True  # groups (a head and the epilogues ORT fuses into it) are measured as one subgraph

    def node_costs(self, graph: Graph, nodes: Iterable[Node]) -> list[float]:
        """Seconds per node of ``graph``, each alone: from the cache, else measured (in one go)."""
        return self.group_costs([(graph, (n,)) for n in nodes])

    def group_costs(self, items: Sequence[tuple[Graph, tuple[Node, ...]]]) -> list[float]:
        """Seconds per (graph, group): each group (one node, or a head and its fused epilogues) runs
        as one subgraph; from the cache, else measured, all unknown ones in one batch."""
        costs: list[float | None] = [None] * len(items)
        keyed: dict[str, list[int]] = {}
        first: dict[str, tuple[Graph, tuple[Node, ...]]] = {}
        for idx, (graph, group) in enumerate(items):
            if len(group) == 1 and is_folded(graph, group[0]):
                costs[idx] = 0.0
            elif not all(self._measurable(graph, n) for n in group):
                self.stats.fallback += len(group)
                costs[idx] = self._estimate(graph, group)
            else:
                key = self.cache_key(graph, group)
                keyed.setdefault(key, []).append(idx)
                first.setdefault(key, (graph, group))
        known: dict[str, float] = {}
        if keyed and self.cache is not None:
            before = (self.cache.hits, self.cache.misses)
            known = self.cache.get_many(keyed)
            self.stats.cache_hits += self.cache.hits - before[0]
            self.stats.cache_misses += self.cache.misses - before[1]
        elif keyed:
            self.stats.cache_misses += len(keyed)
        if not self.references and known:
            self._choose_references([(k, *first[k]) for k in known], known)
        todo = [(k, *first[k]) for k in keyed if k not in known]
        if todo:
            measured = self._measure_all(todo)
            known.update(measured)
            if self.cache is not None:
                self.cache.put_many({k: (measured[k], "+".join(n.onnx_type for n in group), self.env,
                                         " -> ".join(self._detail(graph, n) for n in group))
                                     for k, graph, group in todo if k in measured})
        for key, positions in keyed.items():
            for idx in positions:
                costs[idx] = known[key] if key in known else self._estimate(*items[idx])
        return [float(c) for c in costs]  # type: ignore[arg-type]

    def _estimate(self, graph: Graph, group: tuple[Node, ...]) -> float:
        """The analytic cost of a group that cannot be measured (or that ORT refused)."""
        return sum(self.fallback.node_cost(graph, n) for n in group)

    # ---- keys --------------------------------------------------------------------------------------
    def cache_key(self, graph: Graph, group: Node | tuple[Node, ...]) -> str:
        """A stable key: environment (provider, device, ORT version, threads) + the node's (or the
        group's) cost key."""
        nodes = (group,) if isinstance(group, Node) else group
        text = repr((self.env, group_key(graph, nodes, node_key)))
        return hashlib.blake2b(text.encode(), digest_size=20).hexdigest()

    @staticmethod
    def _detail(graph: Graph, node: Node) -> str:
        ins = ", ".join(str(graph.types.get(i)) if i else "-" for i in node.inputs)
        attrs = "" if node.is_opaque else f" {dict(node.attrs)}"
        return f"{node.onnx_type}{attrs} ({ins})"

    @staticmethod
    def _measurable(graph: Graph, node: Node) -> bool:
        """Alone in a model with static inputs: static types everywhere, no subgraphs, and no integer
        input computed at run time (shape tensors whose value cannot be made up)."""
        if node.implicit or (node.is_opaque and node.origin is None):
            return False
        for name in node.inputs:
            if not name:
                continue
            t = graph.types.get(name)
            if t is None or not t.is_static:
                return False
            if (not np.issubdtype(t.np_dtype, np.floating) and not graph.is_constant_value(name)
                    and graph.producer_of(name) is not None):
                return False
        return all(not o or (graph.types.get(o) is not None and graph.types[o].is_static) for o in node.outputs)

    # ---- measuring ---------------------------------------------------------------------------------
    def _measure_all(self, todo: list[tuple[str, Graph, tuple[Node, ...]]]) -> dict[str, float]:
        started = time.perf_counter()
        results: dict[str, float] = {}
        chunk: list[tuple[str, Graph, tuple[Node, ...]]] = []
        size = 0
        budget = self.batch_bytes - sum(_input_bytes(g, grp) for _, g, grp, _ in self.references)
        for item in todo:
            nbytes = _input_bytes(item[1], item[2])
            if chunk and (len(chunk) >= MAX_BATCH_NODES or size + nbytes > budget):
                results.update(self._measure_scaled(chunk))
                chunk, size = [], 0
            chunk.append(item)
            size += nbytes
        if chunk:
            results.update(self._measure_scaled(chunk))
        self.stats.seconds += time.perf_counter() - started
        return results

    def _measure_scaled(self, chunk: list[tuple[str, Graph, tuple[Node, ...]]]) -> dict[str, float]:
        """Measure a batch with the reference groups in the same session, and scale its costs by how
        fast the references ran against their known costs. The speed of this VM moves between sessions
        by up to 2.5x for memory-bound kernels (a 512x4096 MatMul: 214-550 us over five sessions, the
        order within each session unchanged), and a search compares costs measured in many sessions."""
        if not self.references:
            measured = self._measure_batch(chunk)
            self._choose_references(chunk, measured)
            return measured
        refs = [(_REF + key, graph, group) for key, graph, group, _ in self.references]
        measured = self._measure_batch(chunk + refs)
        pairs = [(measured[_REF + key], cost) for key, _, _, cost in self.references
                 if measured.get(_REF + key, 0.0) > 0]
        factor = min(4.0, max(0.25, sum(m for m, _ in pairs) / sum(c for _, c in pairs))) if pairs else 1.0
        self.stats.session_factors.append(factor)
        return {k: v / factor for k, v in measured.items() if not k.startswith(_REF)}

    def _choose_references(self, items: Sequence[tuple[str, Graph, tuple[Node, ...]]],
                           costs: dict[str, float]) -> None:
        """Up to ``REFERENCES`` of the dearest groups, spread over the upper half by cost: the kernels
        whose speed decides a rewrite (a model's big MatMuls and Convs are memory- or compute-bound, its
        small ops overhead-bound, and a slow session slows the former far more)."""
        # in-cache measuring: references small enough to leave most of each batch's bytes to the groups
        most = self.batch_bytes // (2 * REFERENCES) if self.in_cache else self.batch_bytes
        known = sorted(((costs[k], k, g, grp) for k, g, grp in items
                        if costs.get(k, 0.0) > 0 and _input_bytes(g, grp) <= most), key=lambda t: -t[0])
        upper = known[: max(1, len(known) // 2)]
        step = max(1, len(upper) // REFERENCES)
        self.references = [(k, g, grp, c) for c, k, g, grp in upper[::step][:REFERENCES]]

    def _measure_batch(self, chunk: list[tuple[str, Graph, tuple[Node, ...]]]) -> dict[str, float]:
        """Measure a batch in one session; if ORT refuses it, halve it until the culprit is alone."""
        try:
            batch = self._build(chunk)
            times = self._profile(batch, len(chunk))
        except Exception:  # noqa: BLE001 - any ORT failure: find which node it was
            if len(chunk) == 1:
                self.stats.failed += 1
                return {}
            half = len(chunk) // 2
            return {**self._measure_batch(chunk[:half]), **self._measure_batch(chunk[half:])}
        self.stats.measured += sum(1 for key, _, _ in chunk if not key.startswith(_REF))
        return {key: times.get(idx, 0.0) for idx, (key, _, _) in enumerate(chunk)}

    def _build(self, chunk: list[tuple[str, Graph, tuple[Node, ...]]]) -> _Batch:
        """One model holding each group as an independent subgraph named ``xf<idx>...``; a group's
        inner values are not outputs of the model, so ORT can fuse its nodes as in the real model."""
        template = chunk[0][1].context.template if chunk[0][1].context is not None else None
        opset = chunk[0][1].context.opset if chunk[0][1].context is not None else 17
        nodes: list[onnx.NodeProto] = []
        inputs: list[onnx.ValueInfoProto] = []
        outputs: list[onnx.ValueInfoProto] = []
        constants: dict[str, np.ndarray] = {}
        feeds: dict[str, np.ndarray] = {}
        nbytes = 0
        for idx, (_, graph, group) in enumerate(chunk):
            made = {o for n in group for o in n.outputs if o}
            read = {i for n in group for i in n.inputs if i}
            rename: dict[str, str] = {}
            for name in (i for n in group for i in n.inputs):
                if not name or name in rename or name in made:
                    continue
                new = rename[name] = f"xf{idx}v_in{len(rename)}"
                t = graph.types[name]
                if graph.is_constant(name):
                    constants[new] = graph.constants[name].value()
                elif graph.is_constant_value(name):  # folded into an initializer before the model runs
                    constants[new] = self._random(t.np_dtype, t.static_shape)
                else:
                    feeds[new] = self._random(t.np_dtype, t.static_shape)
                    inputs.append(onnx.helper.make_tensor_value_info(new, t.dtype, t.static_shape))
                nbytes += t.size * t.np_dtype.itemsize
            encoder = _BatchEncoder(opset, f"xf{idx}", constants)
            protos: list[onnx.NodeProto] = []
            for member, node in enumerate(group):
                new_outputs = []
                for k, o in enumerate(node.outputs):
                    if not o:
                        new_outputs.append("")
                    elif o in read:  # inner value of the group
                        new_outputs.append(rename.setdefault(o, f"xf{idx}v_m{member}_{k}"))
                    else:
                        new_outputs.append(rename.setdefault(o, f"xf{idx}o{len(outputs)}"))
                        t = graph.types[o]
                        outputs.append(onnx.helper.make_tensor_value_info(rename[o], t.dtype, t.static_shape))
                new_inputs = tuple(rename.get(i, "") for i in node.inputs)
                if node.is_opaque:
                    proto = onnx.NodeProto()
                    proto.CopyFrom(node.origin.proto)  # type: ignore[union-attr]
                    del proto.input[:]
                    proto.input.extend(new_inputs)
                    del proto.output[:]
                    proto.output.extend(new_outputs)
                    protos.append(proto)
                else:
                    renamed = dataclasses.replace(node, inputs=new_inputs, outputs=tuple(new_outputs),
                                                  name=f"xf{idx}n")
                    protos.extend(OPS[node.op].encode(renamed, encoder))
            for j, proto in enumerate(protos):
                proto.name = f"xf{idx}n{j}"
            nodes.extend(protos)
        body = onnx.helper.make_graph(nodes, "xflow_cost_batch", inputs, outputs,
                                      [numpy_helper.from_array(np.asarray(a), n) for n, a in constants.items()])
        if template is not None:
            model = onnx.helper.make_model(body, opset_imports=list(template.opset_import))
            model.ir_version = template.ir_version
            model.functions.extend(template.functions)
        else:
            model = onnx.helper.make_model(body, opset_imports=[onnx.helper.make_opsetid("", opset)])
            model.ir_version = 8
        import_node_domains(model)  # a fused contrib kernel's domain, when the batch holds one
        return _Batch(model, feeds, nbytes)

    def _random(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        if np.issubdtype(dtype, np.floating):
            return self.rng.uniform(-1, 1, size=shape).astype(dtype)
        return np.zeros(shape, dtype=dtype)  # valid indices / masks for any integer or boolean input

    def _profile(self, batch: _Batch, count: int) -> dict[int, float]:
        """Run the batch model warm-up + timed times with ORT profiling; median seconds per subgraph."""

        # ORT writes its profile to a file: a fresh folder of the run's scratch (or of the system temp directory)
        with self.sessions.folder() as folder:
            optimized = os.path.join(folder, "optimized.onnx")
            renaming = any(n.op_type in RENAMED_BY_ORT for n in batch.model.graph.node)
            profiling = Profiling(os.path.join(folder, "profile"), optimized if renaming else None)
            session = self.sessions.open(batch.model, profiling=profiling)
            self.stats.sessions += 1
            renamed = _renamed_nodes(optimized) if os.path.exists(optimized) else {}
            for _ in range(self.warmup + self.runs):
                session.run(None, batch.feeds)
            with open(session.end_profiling(), encoding="utf-8") as f:
                events = json.load(f)
        return _median_kernel_times(events, self.warmup, count, renamed)


def _renamed_nodes(path: str) -> dict[str, int]:
    """Node name -> subgraph index for the fused nodes (``_FUSED_TYPES``) ORT made under a name of its own
    in the optimized batch model at ``path``, and the Reshapes its MatMulAddFusion put around a Gemm: by the
    subgraph whose values the node writes, or else reads."""
    found: dict[str, int] = {}
    for node in onnx.load(path, load_external_data=False).graph.node:
        if _EVENT.match(node.name) or not (node.op_type in _FUSED_TYPES or _FUSION_RESHAPES.match(node.name)):
            continue
        for values in (node.output, node.input):
            owners = {int(m.group(1)) for m in (_VALUE.match(v) for v in values if v) if m}
            if owners:
                if len(owners) == 1:
                    found[node.name] = owners.pop()
                break
    return found


def last_level_cache_bytes() -> int | None:
    """Size of the CPU's largest (last-level) cache, from sysfs; None where it cannot be read."""
    sizes = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = os.listdir(base)
    except OSError:
        return None
    for entry in entries:
        try:
            with open(os.path.join(base, entry, "size"), encoding="utf-8") as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes) if sizes else None


def in_cache_batch_bytes(graph: Graph, provider: str) -> int | None:
    """The measuring batch budget for a model whose weights fit in the CPU's last-level cache: half that
    cache; None (measure as now, weights streamed from memory) otherwise or off the CPU.

    A model whose weights fit in the cache (NasRNN's 16.8 MB of tied weights in a 32 MB L3) reads them
    from the cache on every run, so its small MatMuls cost launch and compute, not memory traffic;
    measured in batches that stream hundreds of MB, a [1,512]x[512,4096] MatMul cost 320 us against
    141 us in the cache, and merging eight of them looked no cheaper than leaving them apart."""
    if provider != "cpu":
        return None
    cache = last_level_cache_bytes()
    if cache is None:
        return None
    weights = sum(c.nbytes for c in graph.constants.values())
    return cache // 2 if weights <= cache else None


def _input_bytes(graph: Graph, group: tuple[Node, ...]) -> int:
    total = 0
    for name in (i for n in group for i in n.inputs):
        t = graph.types.get(name) if name else None
        if t is not None and t.is_static:
            total += t.size * t.np_dtype.itemsize
    return total


def _median_kernel_times(events: list[dict], warmup: int, count: int,
                         renamed: dict[str, int] | None = None) -> dict[int, float]:
    """Per subgraph index: median over the runs after ``warmup`` of its summed kernel times (seconds);
    ``renamed``: fused nodes ORT named afresh -> their subgraph index (see ``_renamed_nodes``)."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session"
                  and e.get("name") == "model_run")
    starts = [r[0] for r in runs]
    per_run: dict[int, dict[int, float]] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        m = _EVENT.match(e["name"])
        idx = int(m.group(1)) if m is not None else (renamed or {}).get(e["name"][: -len("_kernel_time")])
        if idx is None or idx >= count:
            continue  # layout reorders and copies ORT inserted around a node: not the node's own work
        run = bisect.bisect_right(starts, e["ts"]) - 1
        if run < warmup:
            continue
        slot = per_run.setdefault(idx, {})
        slot[run] = slot.get(run, 0.0) + e["dur"] * 1e-6
    return {idx: statistics.median(by_run.values()) for idx, by_run in per_run.items()}


"""``xflow bench``: zoo models and ONNX files, original vs xflow-optimized (and onnxsim, onnxslim, ORT's
transformer optimizer, onnxscript's ``optimize_for_ort`` where they apply), all timed in the same interleaved runs
at ORT_ENABLE_ALL with spinning off. A model with dynamic dims is timed at the first point of the shape plan
``xflow optimize`` measures at (a decode step, batch 1 over a cache of 127, for a model with a KV cache). A peer
whose outputs drift from the original's beyond tolerance is flagged and counts as 1.0x."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import logging
import math
import os
import platform
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

from xflow.cost.measured import device_name
from xflow.errors import XflowError
from xflow.ir.dims import free_symbols, is_static
from xflow.onnx_io.shape_profile import ShapePlan, shape_plan
from xflow.optimize import DEFAULTS, Decision, OptimizeOptions, optimize_file
from xflow.ort import open_session
from xflow.rules.naming import by_readable_name
from xflow.runtime import measure_interleaved, random_feeds

#: Where the rows go when no ``say`` is given (the library never prints; ``xflow bench`` echoes them).
_log = logging.getLogger(__name__)

ORIGINAL = "original"
XFLOW = "xflow"
ONNXSIM = "onnxsim"
ONNXSLIM = "onnxslim"
ORT_TRANSFORMERS = "ort-transformers"
ONNXSCRIPT = "onnxscript"  # onnxscript's optimize_for_ort (ORT's fusions as onnxscript rewrite rules)


@dataclass
class BenchRow:
    """One model's figures."""

    model: str
    nodes_before: int
    nodes_after: int
    rules_applied: dict[str, int]  # by readable rule name
    search_cold_s: float
    search_warm_s: float
    decision: str
    latency_ms: dict[str, float] = field(default_factory=dict)  # variant -> median ms
    speedup: dict[str, float] = field(default_factory=dict)  # variant -> original / variant
    runs: int = 0
    notes: list[str] = field(default_factory=list)
    nodes_opaque: int = 0  # nodes of the model outside xflow's algebra
    nodes_opaque_computing: int = 0  # of those, the ones computing at run time (no Constant, no folded shape node)
    drifted: list[str] = field(default_factory=list)  # peers whose outputs differ from the original's
    timed_at: dict[str, int] = field(default_factory=dict)  # the dynamic dims' sizes it was timed and checked at


@dataclass
class BenchSettings:
    """What the bench runs with."""

    rules_path: str | None = DEFAULTS.rules_path
    provider: str = DEFAULTS.runtime.provider
    threads: int | None = DEFAULTS.runtime.threads
    small: bool = False
    budget: int = DEFAULTS.search.budget  # the search settings of ``xflow optimize``: the bench runs what a user runs
    patience: int | None = DEFAULTS.search.patience
    time_limit: float = DEFAULTS.search.time_limit
    seconds_per_model: float = 30.0  # a large model needs tens of interleaved rounds for a stable ratio
    min_runs: int = 10
    seed: int = DEFAULTS.inputs.seed
    # sessions per variant, all interleaved: a session's luck (where its buffers land) lasts its life and
    # moves one session of a model 1-12% from another, so each column is the median of its sessions' medians
    sessions_per_variant: int = 3
    # ORT's transformer optimizer on a model with a KV cache (its gpt2 type) needs these; None: read from the graph
    num_heads: int | None = None
    hidden_size: int | None = None


def onnxsim_available() -> bool:
    """True when the optional ``onnxsim`` package is installed (``pip install 'xflow-opt[bench]'``)."""
    return _installed("onnxsim")


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _onnxslim(model_path: str, out_path: str) -> str | None:
    import onnxslim

    with contextlib.redirect_stdout(io.StringIO()):  # it prints a summary table
        slimmed = onnxslim.slim(model_path)
    if slimmed is None:
        return "onnxslim: returned no model"
    onnx.save(slimmed, out_path)
    return None


def _onnxsim(model_path: str, out_path: str) -> str | None:
    import onnxsim

    simplified, ok = onnxsim.simplify(onnx.load(model_path))
    if not ok:
        return "onnxsim: its own check failed"
    onnx.save(simplified, out_path)
    return None


def _looks_like_transformer(model: onnx.ModelProto) -> bool:
    ops = {n.op_type for n in model.graph.node}
    return ("LayerNormalization" in ops or "ReduceMean" in ops) and "Softmax" in ops and "MatMul" in ops


def attention_sizes(model: onnx.ModelProto, plan: ShapePlan) -> tuple[int, int] | None:
    """(num_heads, hidden_size) of a decoder with a KV cache, read from its graph: the hidden size is the width of
    the embedding table the token ids gather from, the head size the last dim of the cache inputs; None where the
    graph does not say (no such Gather, cache inputs of different or unnamed head sizes, a width they do not divide)."""
    if not plan.relations.caches:
        return None
    past = {c.past for c in plan.relations.caches}
    head_dims = {int(dims[-1]) for dims in plan.input_dims.values()
                 if dims and len(dims) == 4 and past & set(free_symbols(dims)) and is_static(dims[-1])}
    tables = {t.name: tuple(t.dims) for t in model.graph.initializer}
    inputs = set(plan.input_dims)
    widths = {tables[n.input[0]][1] for n in model.graph.node
              if n.op_type == "Gather" and len(n.input) == 2 and n.input[1] in inputs
              and len(tables.get(n.input[0], ())) == 2 and not any(a.name == "axis" and a.i != 0 for a in n.attribute)}
    if len(head_dims) != 1 or len(widths) != 1:
        return None
    (head_dim,), (hidden,) = head_dims, widths
    return (hidden // head_dim, hidden) if head_dim and hidden % head_dim == 0 else None


def _ort_transformers(model_path: str, out_path: str, provider: str, model_type: str = "bert",
                      num_heads: int = 0, hidden_size: int = 0) -> None:
    from onnxruntime.transformers import optimizer

    logging.disable(logging.WARNING)  # it warns about the model's producer name on stdout/stderr
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            optimized = optimizer.optimize_model(model_path, model_type=model_type, num_heads=num_heads,
                                                 hidden_size=hidden_size, use_gpu=provider == "cuda", opt_level=0)
            optimized.save_model_to_file(out_path)
    finally:
        logging.disable(logging.NOTSET)


def _onnxscript(model_path: str, out_path: str) -> str | None:
    import onnx_ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model = onnx_ir.load(model_path)
    optimized, _fused = optimize_for_ort(model)
    onnx_ir.save(optimized, out_path)
    return None


def _ort_transformers_peer(model: onnx.ModelProto, plan: ShapePlan, settings: BenchSettings
                           ) -> tuple[dict[str, object] | None, str | None]:
    """The keyword arguments ORT's transformer optimizer runs with on ``model`` (its bert type, or for a model with
    a KV cache its gpt2 type with the attention sizes), or None and why it does not run."""
    if not _looks_like_transformer(model):
        return None, None
    if not plan.relations.caches:
        return {"model_type": "bert", "num_heads": settings.num_heads or 0,
                "hidden_size": settings.hidden_size or 0}, None
    found = attention_sizes(model, plan)
    num_heads = settings.num_heads or (found[0] if found else None)
    hidden = settings.hidden_size or (found[1] if found else None)
    if num_heads is None or hidden is None:
        return None, ("ORT transformer optimizer not run: its gpt2 type needs num_heads and hidden_size, which the "
                      "graph does not tell (give --num-heads and --hidden-size)")
    return {"model_type": "gpt2", "num_heads": num_heads, "hidden_size": hidden}, None


def bench_point(model: onnx.ModelProto, path: str) -> tuple[ShapePlan, dict[str, int]]:
    """The model's shape plan (``xflow optimize``'s defaults) and its first point, where the bench times and checks
    (every dim static: no point)."""
    plan = shape_plan(model, {}, {}, path)
    return plan, (plan.points()[0] if plan.is_dynamic else {})


def bench_model(label: str, model_path: str, work: str, settings: BenchSettings,
                say: Callable[[str], None] = _log.info) -> BenchRow:
    """Search cold and warm, write xflow's model (verified, never slower), build the other tools'
    models, and time them all against the original in the same interleaved runs."""
    cold_db = os.path.join(work, f"{label}.costs.sqlite")  # fresh: a cold cost cache for this model
    base = OptimizeOptions.of(rules_path=settings.rules_path, budget=settings.budget, patience=settings.patience,
                              time_limit=settings.time_limit, provider=settings.provider, threads=settings.threads,
                              cost_db=cold_db, seed=settings.seed)
    quiet: Callable[[str], None] = lambda _m: None  # noqa: E731
    cold = optimize_file(model_path, os.path.join(work, f"{label}.cold.onnx"),
                         dataclasses.replace(base, checks=dataclasses.replace(base.checks, measure=False)), say=quiet)
    xflow_path = os.path.join(work, f"{label}.xflow.onnx")
    warm = optimize_file(model_path, xflow_path, base, say=quiet)
    written = Decision(warm.outcome).writes_optimized  # faster, or simpler and not slower
    row = BenchRow(label, warm.nodes_before, warm.nodes_after if written else warm.nodes_before,
                   by_readable_name(warm.rules_applied, warm.rule_names),
                   cold.search_ms / 1e3, warm.search_ms / 1e3, warm.decision)
    if warm.finalists:
        row.notes.append("branches timed end to end: " + ", ".join(
            f"{f['rewrites']} rewrites{' (completed)' if f.get('completed') else ''} {f['measured_ms']:.3f} ms"
            f"{' (kept)' if f['chosen'] else ''}"
            for f in warm.finalists if f["measured_ms"] is not None))
    if warm.session_pairs:
        row.notes.append(f"xflow's A/B: {warm.speedup:.3f}x over {warm.session_pairs} session pairs, faster in "
                         f"{warm.faster_pairs}, signed-rank p = {warm.rank_test_p:.2g} ({warm.decision})")
    # Every column is timed the same way, xflow's included when it wrote the original back: its ratio then
    # shows the noise of two sessions of one model, as the other tools' columns carry it too.
    paths = {ORIGINAL: model_path, XFLOW: xflow_path}
    if not written and _same_graph(model_path, xflow_path):
        row.notes.append("xflow wrote the original back (timed as written, like every column)")
    header = onnx.load(model_path, load_external_data=False)
    plan, point = bench_point(header, model_path)
    row.timed_at = dict(point)
    if point:
        row.notes.append(f"timed and checked at {plan.describe(point)}")
    for peer, build in ((ONNXSIM, _onnxsim), (ONNXSLIM, _onnxslim), (ONNXSCRIPT, _onnxscript)):
        if not _installed(peer):
            row.notes.append(f"{peer} not installed (pip install 'xflow-opt[bench]')")
            continue
        peer_path = os.path.join(work, f"{label}.{peer}.onnx")
        try:
            problem = build(model_path, peer_path)
        except Exception as exc:  # noqa: BLE001 - a third-party tool failing is a figure, not our error
            problem = f"{peer} failed: {_first_line(exc)}"
        if problem:
            row.notes.append(problem)
        else:
            paths[peer] = peer_path
    ort_args, why_not = _ort_transformers_peer(header, plan, settings)
    if why_not:
        row.notes.append(why_not)
    if ort_args is not None:
        ort_path = os.path.join(work, f"{label}.ort-transformers.onnx")
        try:
            _ort_transformers(model_path, ort_path, settings.provider, **ort_args)  # type: ignore[arg-type]
            paths[ORT_TRANSFORMERS] = ort_path
            if ort_args["model_type"] != "bert":
                row.notes.append(f"ORT transformer optimizer run as {ort_args['model_type']} with num_heads "
                                 f"{ort_args['num_heads']}, hidden_size {ort_args['hidden_size']}")
        except Exception as exc:  # noqa: BLE001 - a third-party tool failing is a figure, not our error
            row.notes.append(f"ORT transformer optimizer failed: {_first_line(exc)}")
    sessions = {}
    for name, path in paths.items():
        try:
            sessions[name] = open_session(path, settings.provider, settings.threads)
        except Exception as exc:  # noqa: BLE001 - another tool's output ORT refuses is a note, not a crash
            if name in (ORIGINAL, XFLOW):
                raise
            row.notes.append(f"{name}'s model does not load in ONNX Runtime: {_first_line(exc)}")
    feeds = random_feeds(sessions[ORIGINAL], settings.seed, plan.shapes_at(point) if point else None)
    for name, problem in output_drift(sessions, feeds).items():
        row.drifted.append(name)
        row.notes.append(f"{name} changes the outputs ({problem}): counted as 1.0x")
    timed = {(name, 0): session for name, session in sessions.items()}
    for copy in range(1, settings.sessions_per_variant):  # made in turns, so no variant's sessions are all newer
        timed |= {(name, copy): open_session(paths[name], settings.provider, settings.threads) for name in sessions}
    per_session, row.runs = measure_interleaved(timed, feeds, settings.min_runs, settings.seconds_per_model)
    medians = {name: statistics.median(m for (variant, _), m in per_session.items() if variant == name)
               for name in sessions}
    row.latency_ms = {name: m * 1e3 for name, m in medians.items()}
    row.speedup = {name: medians[ORIGINAL] / m for name, m in medians.items() if name != ORIGINAL}
    row.nodes_opaque, row.nodes_opaque_computing = warm.nodes_opaque, warm.nodes_opaque_computing
    say(format_row(row))
    return row


def _first_line(exc: Exception) -> str:
    """'Type: first line of the message' (cut at 200 characters)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def output_drift(sessions: dict[str, object], feeds: dict[str, object]) -> dict[str, str]:
    """The variants whose outputs on ``feeds`` differ from the original's beyond the comparison tolerance
    (``xflow.equivalence``), with the difference (a variant that fails to run counts as drifting)."""
    from xflow.equivalence import EquivalenceError, check_outputs

    original = sessions[ORIGINAL]
    names = [o.name for o in original.get_outputs()]  # type: ignore[attr-defined]
    expected = original.run(None, feeds)  # type: ignore[attr-defined]
    drift: dict[str, str] = {}
    for variant, session in sessions.items():
        if variant == ORIGINAL:
            continue
        try:
            check_outputs(names, expected, session.run(names, feeds))  # type: ignore[attr-defined]
        except EquivalenceError as exc:
            drift[variant] = exc.problem
        except Exception as exc:  # noqa: BLE001 - a peer's model that ORT cannot run drifts by definition
            drift[variant] = f"ONNX Runtime cannot run it: {type(exc).__name__}"
    return drift


def _same_graph(path_a: str, path_b: str) -> bool:
    """True when two ONNX files hold the same graph (weights included)."""
    return onnx.load(path_a).graph == onnx.load(path_b).graph


def run_bench(models: list[str], settings: BenchSettings, say: Callable[[str], None] = _log.info,
              work: str | None = None) -> list[BenchRow]:
    """Bench zoo model names and ONNX file paths in order."""
    from xflow import zoo

    rows: list[BenchRow] = []
    with tempfile.TemporaryDirectory(prefix="xflow-bench-", dir=work) as folder:
        for item in models:
            if item in zoo.MODELS:
                label = item + (" (small)" if settings.small else "")
                path = os.path.join(folder, f"{item}.onnx")
                onnx.save(zoo.build(item, small=settings.small, seed=settings.seed), path)
            elif os.path.isfile(item):
                label, path = os.path.splitext(os.path.basename(item))[0], item
            else:
                raise XflowError(item, f"neither a zoo model ({', '.join(zoo.MODELS)}) nor an ONNX file")
            rows.append(bench_model(label, path, folder, settings, say))
    return rows


def geomean(values: list[float]) -> float:
    """Geometric mean (nan for none)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


VARIANTS = (XFLOW, ONNXSIM, ONNXSLIM, ORT_TRANSFORMERS, ONNXSCRIPT)
HEADER = ("| model | nodes before → after | computing outside the algebra | rules applied | search cold / warm (s) "
          "| original (ms) | xflow (ms) | xflow speedup | onnxsim speedup | onnxslim speedup "
          "| ORT transformers speedup | onnxscript speedup |")
COLUMNS = HEADER.count("|") - 1


def counted_speedup(row: BenchRow, variant: str) -> float | None:
    """The variant's speedup as the geomean counts it: 1.0 for a peer that changes the outputs."""
    if variant not in row.speedup:
        return None
    return 1.0 if variant in row.drifted else row.speedup[variant]


#: The report's ``decision`` words of a run that wrote its optimized model.
_WRITTEN = frozenset(d.describe(copied=False) for d in Decision if d.writes_optimized)


def format_row(row: BenchRow) -> str:
    """One markdown table row."""
    rules = ", ".join(f"{k} ×{v}" for k, v in sorted(row.rules_applied.items())) or "—"
    if row.decision not in _WRITTEN and row.rules_applied:
        rules += " (not faster: original kept)"
    cells = [(f"{row.speedup[v]:.3f}× (outputs differ)" if v in row.drifted else f"{row.speedup[v]:.3f}×")
             if v in row.speedup else "—" for v in VARIANTS]
    share = 100.0 * row.nodes_opaque_computing / row.nodes_before if row.nodes_before else 0.0
    return (f"| {row.model} | {row.nodes_before} → {row.nodes_after} | {row.nodes_opaque_computing} ({share:.1f}%) "
            f"of {row.nodes_opaque} opaque | {rules} "
            f"| {row.search_cold_s:.2f} / "
            f"{row.search_warm_s:.2f} | {row.latency_ms[ORIGINAL]:.2f} | {row.latency_ms[XFLOW]:.2f} | "
            + " | ".join(cells) + " |")


def format_table(rows: list[BenchRow], settings: BenchSettings, command: str) -> str:
    """The markdown section for docs/RESULTS.md: command, machine, date, rows and geometric means."""
    import onnxruntime as ort

    lines = [f"`{command}` — {datetime.date.today().isoformat()}, {platform.machine()} machine "
             f"({device_name(settings.provider)}): {os.cpu_count()} cores, ONNX Runtime {ort.__version__}, "
             f"provider {settings.provider}, "
             f"{settings.threads or os.cpu_count()} threads, ORT_ENABLE_ALL, spinning off, "
             f"interleaved runs ({settings.sessions_per_variant} sessions per variant, ≥{settings.min_runs} runs each; "
             "a variant's latency is the median of its sessions' medians).", "", HEADER,
             "| " + " | ".join("---" for _ in range(COLUMNS)) + " |"]
    lines += [format_row(r) for r in rows]
    means = [geomean([x for r in rows if (x := counted_speedup(r, v)) is not None]) for v in VARIANTS]
    lines.append("| **geomean** | | | | | | | " + " | ".join("—" if math.isnan(m) else f"**{m:.3f}×**" for m in means)
                 + " |")
    notes = sorted({f"{r.model}: {n}" for r in rows for n in r.notes})
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def write_chart(rows: list[BenchRow], path: str) -> None:
    """A grouped bar chart of speedups per model (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = [v for v in VARIANTS if any(v in r.speedup for r in rows)]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(rows) + 2), 4))
    width = 0.8 / max(1, len(variants))
    for k, variant in enumerate(variants):
        xs = [i + (k - (len(variants) - 1) / 2) * width for i in range(len(rows))]
        ax.bar(xs, [r.speedup.get(variant, 0.0) for r in rows], width, label=variant)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), [r.model for r in rows], rotation=20, ha="right")
    ax.set_ylabel("speedup over original (×)")
    ax.set_title("ONNX Runtime latency, original / optimized")
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise XflowError(path, f"cannot write chart: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)

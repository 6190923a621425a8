"""Measured node costs: real ONNX Runtime runs, batched sessions, the SQLite cache shared by processes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xflow.cost import GraphCoster
from xflow.cost.cache import CostCache
from xflow.cost.measured import MeasuredCost, describe_cpu
from xflow.onnx_io import graph_from_model

# Few runs keep these tests quick; ordering checks use sizes far apart so 2 noisy cores cannot swap them.
FAST = {"warmup": 1, "runs": 3}


def matmuls_model(sizes: list[int], rows: int = 32) -> onnx.ModelProto:
    """Independent MatMuls x_k @ W_k with W_k of size n x n (constant), one per size."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", [f"x{k}", f"W{k}"], [f"y{k}"]) for k in range(len(sizes))]
    inits = [numpy_helper.from_array(rng.standard_normal((n, n)).astype(np.float32), f"W{k}")
             for k, n in enumerate(sizes)]
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [rows, n]) for k, n in enumerate(sizes)]
    outputs = [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [rows, n]) for k, n in enumerate(sizes)]
    model = helper.make_model(helper.make_graph(nodes, "mm", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def opaque_model() -> onnx.ModelProto:
    """Softplus and LpNormalization: outside the op table, measured from their original protos."""
    nodes = [helper.make_node("Softplus", ["x"], ["s"]),
             helper.make_node("LpNormalization", ["s"], ["y"], axis=-1, p=2)]
    inits: list[onnx.TensorProto] = []
    model = helper.make_model(helper.make_graph(
        nodes, "op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 256])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_costs_are_positive_ordered_and_one_session_measures_many_nodes(tmp_path):
    graph = graph_from_model(matmuls_model([16, 24, 32, 48, 64, 96, 128, 192, 256, 512]))
    model = MeasuredCost(cache=CostCache(tmp_path / "c.sqlite"), **FAST)
    costs = model.node_costs(graph, graph.nodes)
    assert all(c > 0 for c in costs)
    # 512x512 weights vs 16x16: 1000x the FLOPs, but the small node's few microseconds are mostly ORT's per-node
    # overhead, which a loaded machine doubles: about 20x quiet, under 10x under load
    assert costs[-1] > 4 * costs[0]
    assert model.stats.sessions == 1 and model.stats.measured == 10


def test_opaque_nodes_are_measured_too(tmp_path):
    graph = graph_from_model(opaque_model())
    assert all(n.is_opaque for n in graph.nodes)
    model = MeasuredCost(cache=CostCache(tmp_path / "c.sqlite"), **FAST)
    costs = model.node_costs(graph, graph.nodes)
    assert all(c > 0 for c in costs)
    assert model.stats.measured == 2 and model.stats.fallback == 0 and model.stats.failed == 0


def test_cache_round_trip_second_instance_measures_nothing(tmp_path):
    db = tmp_path / "c.sqlite"
    graph = graph_from_model(matmuls_model([32, 64, 128]))
    first = MeasuredCost(cache=CostCache(db), **FAST)
    total = GraphCoster(first).cost(graph)
    assert first.stats.measured == 3 and first.stats.cache_hits == 0
    second = MeasuredCost(cache=CostCache(db), **FAST)
    assert GraphCoster(second).cost(graph) == pytest.approx(total)
    assert second.stats.measured == 0 and second.stats.sessions == 0 and second.stats.cache_hits == 3


def test_key_names_the_environment(tmp_path):
    graph = graph_from_model(matmuls_model([32]))
    model = MeasuredCost(cache=CostCache(tmp_path / "c.sqlite"), **FAST)
    model.node_costs(graph, graph.nodes)
    row = sqlite3.connect(tmp_path / "c.sqlite").execute("SELECT op, env, detail FROM costs").fetchone()
    import onnxruntime as ort

    assert row[0] == "matmul" and row[1].startswith("cpu|") and ort.__version__ in row[1] and "float[32,32]" in row[2]



_EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: {family}
model\t\t: {model}
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu sse sse2 avx fma avx2{extra}

processor\t: 1
model name\t: another CPU the first block's name must win over
"""


def test_the_cpu_is_told_apart_by_generation_not_only_by_its_brand_string():
    zen3 = describe_cpu(_EPYC.format(family=25, model=1, extra=""))
    zen4 = describe_cpu(_EPYC.format(family=25, model=17, extra=" avx512f avx512bw"))
    assert zen3 == "AMD EPYC (family 25, model 1, stepping 1, avx2)"
    assert zen4 == "AMD EPYC (family 25, model 17, stepping 1, avx512f)"
    arm = describe_cpu("processor\t: 0\nCPU part\t: 0xd0c\nFeatures\t: fp asimd sve\nmodel name\t: Neoverse\n")
    assert arm == "Neoverse (part 0xd0c, sve)"
    assert describe_cpu("") == "" and describe_cpu("processor\t: 0\n") == ""


def test_costs_measured_on_another_cpu_generation_are_not_reused(tmp_path, monkeypatch):
    import xflow.cost.measured as measured

    graph = graph_from_model(matmuls_model([32]))
    cache = CostCache(tmp_path / "c.sqlite")
    for model, text in (("1", ""), ("17", " avx512f")):
        monkeypatch.setattr(measured, "device_name", lambda provider, m=model, t=text:
                            describe_cpu(_EPYC.format(family=25, model=m, extra=t)))
        MeasuredCost(cache=cache, **FAST).node_costs(graph, graph.nodes)
    envs = [env for (env,) in sqlite3.connect(tmp_path / "c.sqlite").execute("SELECT env FROM costs ORDER BY env")]
    assert len(envs) == 2 and "model 1," in envs[0] and "model 17," in envs[1]


_WORKER = """
import sys
from tests.test_cost_measured import matmuls_model
from xflow.cost.cache import CostCache
from xflow.cost.measured import MeasuredCost
from xflow.onnx_io import graph_from_model
sizes = [int(s) for s in sys.argv[2].split(",")]
for rows in (8, 16, 24, 32):
    graph = graph_from_model(matmuls_model(sizes, rows))
    model = MeasuredCost(cache=CostCache(sys.argv[1]), warmup=0, runs=1)
    assert all(c > 0 for c in model.node_costs(graph, graph.nodes))
"""


def test_two_processes_share_one_cache(tmp_path):
    db = str(tmp_path / "shared.sqlite")
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, db, sizes], stderr=subprocess.PIPE, text=True)
             for sizes in ("16,32,48,64", "48,64,80,96")]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT count(*) FROM costs").fetchone()[0] == 4 * 6  # 6 distinct sizes x 4 row counts


def test_corrupt_cache_is_moved_aside_and_rebuilt_with_one_warning(tmp_path, capfd):
    db = tmp_path / "c.sqlite"
    db.write_bytes(np.random.default_rng(0).bytes(4096))
    cache = CostCache(db)
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("xflow: warning: cost cache") and "moved it to" in err[0]
    assert cache.rebuilt and len(cache) == 0
    assert [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    graph = graph_from_model(matmuls_model([32]))
    MeasuredCost(cache=cache, **FAST).node_costs(graph, graph.nodes)
    assert len(CostCache(db)) == 1


def test_cli_cost_db_on_unwritable_path_fails_with_one_line(tmp_path):
    from tests.test_cli import qkv_model

    src = qkv_model(tmp_path / "m.onnx", hidden=8, seq=4)
    (tmp_path / "afile").write_text("")
    proc = subprocess.run([sys.executable, "-m", "xflow.cli", "optimize", src, str(tmp_path / "out.onnx"),
                           "--cost-db", str(tmp_path / "afile" / "costs.sqlite")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cost cache" in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_two_concurrent_optimize_processes_share_one_cost_db(tmp_path):
    from tests.rulebook import MATMUL_MERGE
    from tests.test_cli import CONV_BIAS_RELU_FOLD, conv_relu_model, qkv_model, write_rules

    rules = write_rules(tmp_path / "rules.json", [MATMUL_MERGE, CONV_BIAS_RELU_FOLD])
    db = str(tmp_path / "shared.sqlite")
    models = [qkv_model(tmp_path / "q.onnx", hidden=32, seq=8), conv_relu_model(tmp_path / "c.onnx")]
    procs = [subprocess.Popen([sys.executable, "-m", "xflow.cli", "optimize", m, f"{m}.out.onnx", "--rules", rules,
                               "--cost", "measured", "--cost-db", db, "--keep-if-slower", "-q"],
                              stderr=subprocess.PIPE, text=True) for m in models]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    for m in models:
        onnx.checker.check_model(f"{m}.out.onnx")
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT count(*) FROM costs").fetchone()[0] > 0


def test_later_sessions_are_put_on_the_first_sessions_scale_by_reference_groups(tmp_path):
    first = graph_from_model(matmuls_model([16, 64, 128, 256, 512]))
    model = MeasuredCost(cache=CostCache(tmp_path / "c.sqlite"), **FAST)
    costs = model.node_costs(first, first.nodes)
    assert model.stats.session_factors == []  # the first session is the scale
    dearest = sorted(costs, reverse=True)[: len(costs) // 2]
    assert [c for *_, c in model.references] == dearest[: len(model.references)] and model.references
    later = graph_from_model(matmuls_model([32, 96, 384]))
    assert all(c > 0 for c in model.node_costs(later, later.nodes))
    # one more session, the references timed in it too, and only the new nodes counted as measured
    assert model.stats.sessions == 2 and model.stats.measured == 8
    (factor,) = model.stats.session_factors
    assert 0.25 <= factor <= 4.0


def test_the_report_gives_the_range_of_session_scales(tmp_path):
    from xflow.optimize import OptimizeOptions, optimize_file

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", f"W{k}"], [f"y{k}"]) for k in range(2)]  # one input: a merge
    inits = [numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), f"W{k}") for k in range(2)]
    model = helper.make_model(helper.make_graph(
        nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 256])],
        [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [32, 256]) for k in range(2)], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    options = OptimizeOptions.of(cost_db=str(tmp_path / "c.sqlite"), budget=5, measure=False)
    report = optimize_file(str(src), str(tmp_path / "o.onnx"), options, say=lambda _m: None)
    # the original's nodes in the first session, the merged MatMul and its Split in a later one
    assert report.measure_sessions >= 2
    low, high = report.session_scale
    assert 0.25 <= low <= high <= 4.0


def test_a_model_whose_weights_fit_in_the_cache_is_measured_in_cache(tmp_path, monkeypatch):
    """Half the last-level cache per measuring model when the weights fit in it; off the CPU, or for
    weights larger than the cache, the usual batches (None). In-cache costs are cached apart."""
    import xflow.cost.measured as measured

    graph = graph_from_model(matmuls_model([256, 256, 256, 256]))  # 4 x 256 KiB of weights
    monkeypatch.setattr(measured, "last_level_cache_bytes", lambda: 4 << 20)
    assert measured.in_cache_batch_bytes(graph, "cpu") == 2 << 20
    assert measured.in_cache_batch_bytes(graph, "cuda") is None
    monkeypatch.setattr(measured, "last_level_cache_bytes", lambda: 512 << 10)
    assert measured.in_cache_batch_bytes(graph, "cpu") is None
    monkeypatch.setattr(measured, "last_level_cache_bytes", lambda: None)
    assert measured.in_cache_batch_bytes(graph, "cpu") is None

    # four configurations of 181-235 KiB of weights and inputs each: a 500 KiB budget holds two of them
    graph = graph_from_model(matmuls_model([200, 210, 220, 230]))
    small = MeasuredCost(cache=CostCache(tmp_path / "c.sqlite"), batch_bytes=500 << 10, **FAST)
    costs = small.node_costs(graph, graph.nodes)
    assert all(c > 0 for c in costs)
    assert small.stats.sessions == 2 and small.stats.measured == 4
    usual = MeasuredCost(cache=CostCache(tmp_path / "c.sqlite"), **FAST)
    assert usual.cache_key(graph, graph.nodes[0]) != small.cache_key(graph, graph.nodes[0])


def test_last_level_cache_size_is_read_from_sysfs():
    import glob
    import os

    from xflow.cost.measured import last_level_cache_bytes

    size = last_level_cache_bytes()
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        with open(path) as f:
            text = f.read().strip()
        sizes.append(int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]])
    assert size == (max(sizes) if sizes else None)
    assert os.path.isdir("/sys/devices/system/cpu/cpu0/cache") or size is None

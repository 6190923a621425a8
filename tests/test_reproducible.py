"""A plain measured run is deterministic given its cost cache and seed: the cache keeps the end-to-end decisions (the
finalists' timing, the A/B) besides the node costs, so later runs with it read them and write the same bytes, in
any process (hash seeds differ); a fresh cache measures afresh."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.rulebook import MATMUL_MERGE
from tests.test_cli import qkv_model, write_rules
from xflow.cost.cache import SCHEMA_VERSION, CostCache
from xflow.ir import Graph, TensorType
from xflow.optimize.remembered import Remembered, feeds_digest, graph_identity

ROOT = Path(__file__).resolve().parents[1]


def _optimize(src: str, out: Path, rules: str, db: Path, report: Path, hash_seed: str) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    run = subprocess.run([sys.executable, "-m", "xflow.cli", "optimize", src, str(out), "--rules", rules,
                          "--trust-rules", "--cost-db", str(db), "--report", str(report), "--seed", "3"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    return {"report": json.loads(report.read_text()), "stdout": run.stdout,
            "digest": hashlib.sha256(out.read_bytes()).hexdigest()}


def test_four_runs_with_one_cost_cache_write_one_model(tmp_path):
    """q/k/v matmuls that one merge makes one: whether the merge measures faster is a close call the A/B makes
    afresh each run without the cache (the issue's three files out of four runs); with it, one file."""
    src = qkv_model(tmp_path / "qkv.onnx", hidden=256, seq=64)
    rules = write_rules(tmp_path / "rules.json", [MATMUL_MERGE])
    db = tmp_path / "costs.sqlite"
    runs = [_optimize(src, tmp_path / f"out{k}.onnx", rules, db, tmp_path / f"r{k}.json", str(k)) for k in range(4)]
    assert len({r["digest"] for r in runs}) == 1
    first, later = runs[0]["report"], [r["report"] for r in runs[1:]]
    assert first["steps"], "the merge measures cheaper in the search (the A/B then decides)"
    assert "ab" in first["decisions_timed"] and not first["decisions_from_cache"]  # a fresh cache: measured
    for report in later:
        assert report["decisions_from_cache"] == first["decisions_timed"] and not report["decisions_timed"]
        assert report["nodes_measured"] == 0 and report["cost_db_misses"] == 0  # the search asked only known costs
        assert (report["outcome"], report["speedup"]) == (first["outcome"], first["speedup"])
    assert "timings read from the cost cache" in runs[1]["stdout"]


def _graph(shape: tuple[int, ...]) -> Graph:
    return Graph((), ("x",), ("x",), {"x": TensorType(1, shape)}, {})


def test_a_decision_is_read_back_only_for_what_decided_it(tmp_path):
    cache = CostCache(tmp_path / "c.sqlite")
    memo = Remembered(cache, "cpu|test")
    feeds = {"x": np.zeros((2, 3), np.float32)}
    timed: list[int] = []

    def measure(value: int):
        def run() -> int:
            timed.append(value)
            return value
        return run

    def pick(graphs, feeds, value):
        return memo.pick(graphs, feeds, measure(value), lambda v: v, int)

    a, b = _graph((2, 3)), _graph((4, 3))
    assert graph_identity(a) != graph_identity(b)  # alike but for a shape
    assert pick([a, b], feeds, 1) == 1 and pick([a, b], feeds, 2) == 1 and timed == [1]
    assert pick([b, a], feeds, 3) == 3  # other finalists in another order: another decision
    assert pick([a, b], {"x": np.ones((2, 3), np.float32)}, 4) == 4  # other inputs (a seed)
    assert Remembered(cache, "cpu|other threads").pick([a, b], feeds, lambda: 5, lambda v: v, int) == 5
    assert memo.read == ["select"] and memo.measured == ["select"] * 3
    assert feeds_digest(feeds) == feeds_digest({"x": np.zeros((2, 3), np.float32)})
    cache.close()


def test_a_schema_1_cache_is_migrated_keeping_its_costs(tmp_path):
    db = tmp_path / "old.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('schema', '1')")
    conn.execute("CREATE TABLE costs (key TEXT PRIMARY KEY, seconds REAL NOT NULL, op TEXT NOT NULL, "
                 "env TEXT NOT NULL, detail TEXT NOT NULL, created REAL NOT NULL)")
    conn.execute("INSERT INTO costs VALUES ('k', 0.5, 'Relu', 'cpu', '', 0)")
    conn.commit()
    conn.close()
    cache = CostCache(db)
    assert cache.get_many(["k"]) == {"k": 0.5}
    cache.put_decision("d", "ab", "cpu", "{}")
    assert cache.get_decision("d") == "{}" and cache.get_decision("e") is None
    cache.close()
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone() == (str(SCHEMA_VERSION),)
    conn.close()

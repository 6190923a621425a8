"""The numeric check's array backend: numpy unless XFLOW_NUMERIC_BACKEND says cupy, and on a GPU (cupy) the same
answers as numpy: every op's kernel, every shipped rule's check, the verifier's verdicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from xflow.verifier.numeric import BACKEND_ENV, array_module, numeric_check, pick_backend

from tests.test_ops import CASES, Shape, make_node_for, random_inputs
from xflow.errors import XflowError
from xflow.ops import OPS
from xflow.rules import load_rules
from xflow.rules.io import dump_rules


def _cupy() -> Any:
    try:
        return pick_backend("cupy")
    except XflowError:
        return None


CUPY = _cupy()


def test_numpy_is_the_default_even_with_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert array_module() is np
    assert pick_backend("numpy") is np
    with pytest.raises(XflowError, match="expected numpy or cupy"):
        pick_backend("torch")


@pytest.mark.skipif(CUPY is not None, reason="cupy works here")
def test_asking_for_cupy_without_a_gpu_is_a_clear_error() -> None:
    with pytest.raises(XflowError, match="cupy does not import or finds no working GPU"):
        pick_backend("cupy")


def _verify_rules(tmp_path: Any, backend: str, rules: str, jobs: int = 1) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, BACKEND_ENV: backend}
    return subprocess.run([sys.executable, "-m", "xflow.cli", "verify-rules", rules, "--jobs", str(jobs),
                           "--report", str(tmp_path / f"{backend}.json")],
                          capture_output=True, text=True, env=env, timeout=600, check=False)


def test_an_unknown_backend_is_one_line_and_nonzero(tmp_path: Any) -> None:
    rules = tmp_path / "rules.json"
    dump_rules(load_rules(None)[:2], rules)
    run = _verify_rules(tmp_path, "torch", str(rules))
    assert run.returncode != 0
    assert run.stderr.strip().splitlines() == [f"xflow: error: {BACKEND_ENV}='torch': expected numpy or cupy"]
    assert not (tmp_path / "torch.json").exists()


def test_cupy_in_local_workers_is_refused_before_any_work(tmp_path: Any) -> None:
    rules = tmp_path / "rules.json"
    dump_rules(load_rules(None)[:2], rules)
    run = _verify_rules(tmp_path, "cupy", str(rules), jobs=2)
    problem = ("needs --jobs 1: local worker processes run under an address-space limit of 4 GiB"
               if CUPY is not None else "but cupy does not import or finds no working GPU")
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"xflow: error: {BACKEND_ENV}=cupy") and problem in lines[0]
    assert not (tmp_path / "cupy.json").exists()


@pytest.mark.gpu
@pytest.mark.skipif(CUPY is None, reason="no cupy with a working GPU")
@pytest.mark.parametrize(("op", "shapes", "attrs"), CASES)
def test_kernel_on_cupy_equals_numpy(op: str, shapes: tuple[Shape, ...], attrs: dict[str, Any]) -> None:
    node = make_node_for(op, shapes, attrs)
    arrays = random_inputs(op, shapes, np.float64 if shapes else np.float32)
    want = OPS[op].evaluate(np, arrays, node.attrs)
    got = OPS[op].evaluate(CUPY, [CUPY.asarray(a) for a in arrays], node.attrs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g = CUPY.asnumpy(g)
        assert g.shape == np.shape(w) and g.dtype == np.asarray(w).dtype
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(CUPY is None, reason="no cupy with a working GPU")
def test_every_shipped_rule_checks_the_same_on_cupy() -> None:
    for rule in load_rules(None):
        found_on = rule.provenance.get("found_on")
        on_numpy = numeric_check(rule, xp=np, found_on=found_on)
        on_cupy = numeric_check(rule, xp=CUPY, found_on=found_on)
        assert (on_cupy.ok, on_cupy.trials_run, on_cupy.shapes) == (on_numpy.ok, on_numpy.trials_run,
                                                                     on_numpy.shapes), rule.name
        assert on_cupy.ok, rule.name
        assert abs(on_cupy.max_abs_err - on_numpy.max_abs_err) <= 1e-12, rule.name


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(CUPY is None, reason="no cupy with a working GPU")
def test_verify_rules_gives_the_same_answers_on_cupy(tmp_path: Any) -> None:
    rules = tmp_path / "rules.json"
    dump_rules(load_rules(None)[::10], rules)
    reports = {}
    for backend in ("numpy", "cupy"):
        run = _verify_rules(tmp_path, backend, str(rules))
        assert run.returncode == 0, run.stdout + run.stderr
        reports[backend] = json.loads((tmp_path / f"{backend}.json").read_text())
    assert reports["cupy"] == reports["numpy"]


@pytest.mark.gpu
@pytest.mark.skipif(CUPY is None, reason="no cupy with a working GPU")
@pytest.mark.parametrize("limit", [0, None])
def test_conv_and_pool_windows_on_cupy_both_paths(limit: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The windows gathered through an index table on the GPU (``limit`` None: the default), and read through a
    strided view (``limit`` 0), equal numpy's, float and integer."""
    from xflow.ops import _windows as windows

    windows._window_index.cache_clear()
    if limit is not None:
        monkeypatch.setattr(windows, "GATHER_LIMIT", limit)
    try:
        for param in CASES:
            op, shapes, attrs = param.values
            if op not in ("conv", "maxpool", "avgpool"):
                continue
            node = make_node_for(op, shapes, attrs)
            for integer in (False, True):
                arrays = (random_inputs(op, shapes, np.int64) if integer else random_inputs(op, shapes, np.float64))
                run = OPS[op].evaluate_int if integer else OPS[op].evaluate
                want = run(np, arrays, node.attrs)[0]
                got = CUPY.asnumpy(run(CUPY, [CUPY.asarray(a) for a in arrays], node.attrs)[0])
                assert got.shape == want.shape and got.dtype == want.dtype, (op, shapes)
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"{op} {shapes}")
    finally:
        windows._window_index.cache_clear()

"""Bad and unusual input to ``xflow optimize``, as a deployment pipeline would feed it.

Each case either is refused with one line on stderr naming the file and the problem and exit code 2,
or passes through correctly (exit 0, a model ONNX Runtime runs with the original's outputs). In every
case the input is byte-identical afterwards and no partial output or temp file is left behind.
(Missing file, directory, empty file, random bytes, truncated model, IN == OUT, a missing output
directory and a bad rule file are in tests/test_cli.py.)
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from tests.rulebook import CONCAT_SPLIT_CANCEL, CONV_RELU_FOLD, MATMUL_MERGE
from xflow.cli import main

SAVE_MODULE = importlib.import_module("xflow.onnx_io.save")  # (the package attribute is the function)
HIDDEN = 8
RULES = {"format": "xflow.rules/1", "rules": [MATMUL_MERGE, CONV_RELU_FOLD, CONCAT_SPLIT_CANCEL]}


# ---- helpers --------------------------------------------------------------------------------------


def make_model(nodes, inputs, outputs, inits=(), opset: int = 17, domains=(), ir_version: int = 8):  # noqa: ANN001
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = ir_version
    return model


def cancel(dtype: int = TensorProto.FLOAT, hidden: int = HIDDEN) -> tuple[list, list]:
    """y = split(concat(relu(x), sigmoid(x)))[0] + [1]: the concat/split cancel rule applies
    (nodes, initializers); ``s1``, an output of the Split, is rewired to ``a`` by it."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Sigmoid", ["x"], ["b"], name="sigmoid"),
             helper.make_node("Concat", ["a", "b"], ["c"], name="concat", axis=-1),
             helper.make_node("Split", ["c", "sizes"], ["s1", "s2"], name="split", axis=-1),
             helper.make_node("Add", ["s1", "s2"], ["y"], name="add")]
    return nodes, [numpy_helper.from_array(np.array([hidden, hidden], np.int64), "sizes")]


def cancel_model(dtype: int = TensorProto.FLOAT, dims=(1, 16, HIDDEN)) -> onnx.ModelProto:
    nodes, inits = cancel(dtype)
    return make_model(nodes, [helper.make_tensor_value_info("x", dtype, list(dims))],
                      [helper.make_tensor_value_info("y", dtype, list(dims))], inits)


def weighted_model() -> tuple[onnx.ModelProto, onnx.TensorProto]:
    """The cancel model with z = y * weight, a 512-byte initializer (the one that goes to external
    data: 1-D integer tensors such as the split sizes stay inline); the model and its weight proto."""
    model = cancel_model()
    weight = numpy_helper.from_array(np.full((16, HIDDEN), 0.5, np.float32), "weight")
    model.graph.node.append(helper.make_node("Mul", ["y", "weight"], ["z"]))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 16, HIDDEN]))
    model.graph.initializer.append(weight)
    return model, model.graph.initializer[-1]


def snapshot(folder) -> dict[str, str]:  # noqa: ANN001
    """Every file under ``folder`` with a digest of its content."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.isfile(path):  # a FIFO would block the read
                out[os.path.relpath(path, folder)] = f"mode {os.stat(path).st_mode:o}"
                continue
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture
def env(tmp_path):
    """(work folder, rules file); the rules file is outside the work folder."""
    work = tmp_path / "work"
    work.mkdir()
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(RULES))
    return work, str(rules)


def run(*args: str):
    """Invoke the CLI in-process (stderr kept apart)."""
    return CliRunner().invoke(main, ["optimize", *args], catch_exceptions=False)


def optimize(src, out, rules: str, *extra: str):  # noqa: ANN001
    return run(str(src), str(out), "--rules", rules, "--cost", "analytic", "--budget", "20", *extra)


def assert_refused(result, src, before: dict[str, str], folder, needle: str) -> None:  # noqa: ANN001
    """Exit 2, one line naming the file and the problem, nothing written, input unchanged."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(src) in lines[0] and needle in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert snapshot(folder) == before


def assert_passes_through(result, src, out, before: dict[str, str], folder,  # noqa: ANN001
                          feeds: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """Exit 0; the input unchanged; the output runs (where ORT can) with the original's outputs;
    nothing but the output (and its data file) added."""
    assert result.exit_code == 0, (result.output, result.stderr)
    after = snapshot(folder)
    added = set(after) - set(before)
    assert added <= {os.path.basename(out), os.path.basename(out) + ".data"}, added
    assert {k: after[k] for k in before} == before
    written = onnx.load(str(out))
    onnx.checker.check_model(written)
    if feeds is not None:
        a = ort.InferenceSession(str(src)).run(None, feeds)
        b = ort.InferenceSession(str(out)).run(None, feeds)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-2 if x.dtype == np.float16 else 1e-4, atol=1e-3)
    return written


def copied_unchanged(work, rules: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray] | None = None):  # noqa: ANN001, ANN201
    """Optimize ``model`` (saved in ``work``) and check that it was written back unchanged; the result."""
    src, out = work / "src.onnx", work / "out.onnx"
    onnx.save(model, src)
    before = snapshot(work)
    result = optimize(src, out, rules)
    assert assert_passes_through(result, src, out, before, work, feeds).graph == model.graph
    return result


# ---- refusals -------------------------------------------------------------------------------------


def test_valid_protobuf_that_is_not_a_model(env):
    work, rules = env
    src = work / "tensor.onnx"
    src.write_bytes(numpy_helper.from_array(np.arange(100, dtype=np.float32), "t").SerializeToString())
    before = snapshot(work)
    assert_refused(optimize(src, work / "out.onnx", rules), src, before, work, "not an ONNX model")


def test_model_failing_the_checker(env):
    work, rules = env
    model = make_model([helper.make_node("Relu", ["nowhere"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    src = work / "bad.onnx"
    onnx.save(model, src)
    before = snapshot(work)
    assert_refused(optimize(src, work / "out.onnx", rules), src, before, work, "invalid ONNX model")


@pytest.mark.parametrize("spec, needle", [("nope=1x2", "not an input"), ("x=1x16x9", "fixed in the model"),
                                           ("x=1x16", "rank")])
def test_input_shape_that_does_not_fit(env, spec, needle):
    work, rules = env
    src = work / "m.onnx"
    onnx.save(cancel_model(), src)
    before = snapshot(work)
    assert_refused(optimize(src, work / "out.onnx", rules, "--input-shape", spec), src, before, work, needle)


@pytest.mark.parametrize("out_name", ["b.onnx", "b.onnx.data"], ids=["data-file-of-output", "output"])
def test_output_that_would_replace_the_inputs_weights(env, out_name):
    """a.onnx keeps its weights in b.onnx.data: writing b.onnx (whose data file is b.onnx.data) or
    b.onnx.data itself would destroy them."""
    work, rules = env
    model, weight = weighted_model()
    with open(work / "b.onnx.data", "wb") as f:
        f.write(b"\0" * 128 + weight.raw_data)
    set_external_data(weight, "b.onnx.data", offset=128, length=len(weight.raw_data))
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    src = work / "a.onnx"
    onnx.save(model, src)
    before = snapshot(work)
    assert_refused(optimize(src, work / out_name, rules), work / out_name, before, work, "holds the input's weights")


@pytest.mark.parametrize("arrays", [{"nope": np.zeros((1, 16, HIDDEN), np.float32)},
                                    {"x": np.zeros((1, 16, HIDDEN), np.float64)}], ids=["name", "dtype"])
def test_inputs_that_do_not_fit_the_model(env, arrays):
    work, rules = env
    src, npz = work / "m.onnx", work / "inputs.npz"
    onnx.save(cancel_model(), src)
    np.savez(npz, **arrays)
    before = snapshot(work)
    result = optimize(src, work / "out.onnx", rules, "--inputs", str(npz))
    assert_refused(result, npz, before, work, "cannot run")


def test_report_naming_the_input(env):
    work, rules = env
    src = work / "m.onnx"
    onnx.save(cancel_model(), src)
    before = snapshot(work)
    result = optimize(src, work / "out.onnx", rules, "--report", str(src))
    assert_refused(result, src, before, work, "--report names the input")


# ---- pass-through and correct optimization ---------------------------------------------------------


def test_unknown_custom_domain_passes_through(env):
    """ORT cannot run a custom-domain op it has no kernel for: nothing can be verified or timed, so the
    original is written unchanged and the run says why."""
    work, rules = env
    nodes, inits = cancel()
    nodes.append(helper.make_node("MyOp", ["y"], ["custom"], domain="com.example"))
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, HIDDEN])],
                       [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 16, HIDDEN]) for n in ("custom",)],
                       inits, domains=["com.example"])
    result = copied_unchanged(work, rules, model)
    assert "ONNX Runtime cannot run" in result.output and "unchanged" in result.output


def test_op_newer_than_ort_supports_passes_through(env):
    """An opset above what the installed ORT implements: ORT refuses it, the original is written."""
    work, rules = env
    nodes, inits = cancel()
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, HIDDEN])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, HIDDEN])], inits,
                       opset=onnx.defs.onnx_opset_version(), ir_version=onnx.IR_VERSION)
    try:
        ort.InferenceSession(model.SerializeToString())
        pytest.skip("the installed ORT runs the newest ONNX opset")
    except Exception:  # noqa: BLE001 - what this test needs is that ORT refuses it
        pass
    assert "ONNX Runtime cannot run" in copied_unchanged(work, rules, model).output


def dynamic_cancel_model() -> onnx.ModelProto:
    """The cancel model with a dynamic batch and sequence (``dim_param``s batch and seq)."""
    nodes, inits = cancel()
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", HIDDEN])], inits)


@pytest.mark.parametrize("extra", [[], ["--input-shape", "x=2x5x8"], ["--shape-profile", "batch=1,3 seq=4"]],
                         ids=["default-profile", "input-shape", "shape-profile"])
def test_dynamic_dims(env, extra):
    """A dynamic model is searched at its measuring shapes (the default profile, --input-shape or
    --shape-profile) as a static one is, and the written model keeps its interface exactly: the same
    inputs and outputs with their dim_params, equal outputs at sizes never measured."""
    work, rules = env
    model = dynamic_cancel_model()
    src, out = work / "dyn.onnx", work / "out.onnx"
    onnx.save(model, src)
    before = snapshot(work)
    result = optimize(src, out, rules, "--report", str(work.parent / "r.json"), "--keep-if-slower", *extra)
    rng = np.random.default_rng(0)
    written = assert_passes_through(result, src, out, before, work,
                                    {"x": rng.standard_normal((3, 7, HIDDEN)).astype(np.float32)})
    for shape in ((1, 1, HIDDEN), (4, 9, HIDDEN)):
        assert_passes_through(result, src, out, before, work, {"x": rng.standard_normal(shape).astype(np.float32)})
    report = json.loads((work.parent / "r.json").read_text())
    assert report["rules_applied"] == {"concat_split_cancel": 1}
    assert report["decision"] == "optimized"
    assert len(report["checked_at"]) >= 1  # an off-profile size besides the measuring one
    assert list(written.graph.input) == list(model.graph.input)
    assert list(written.graph.output) == list(model.graph.output)
    assert written.opset_import == model.opset_import


def test_wrong_shape_profile_name_is_refused(env):
    work, rules = env
    src = work / "dyn.onnx"
    onnx.save(dynamic_cancel_model(), src)
    before = snapshot(work)
    result = optimize(src, work / "out.onnx", rules, "--shape-profile", "batchsize=1,8")
    assert_refused(result, src, before, work, "--shape-profile names 'batchsize', which is not a dynamic dim of the "
                                              "inputs (dynamic dims: batch, seq)")


@pytest.mark.parametrize("kind", ["If", "Loop"])
def test_subgraphs_pass_through_and_outer_rewrites_keep_captures(env, kind):
    work, rules = env
    nodes, inits = cancel()
    body_out = helper.make_tensor_value_info("b_out", TensorProto.FLOAT, [1, 16, HIDDEN])
    if kind == "If":  # the branches read s1 (an output of the Split that the rewrite removes)
        then = helper.make_graph([helper.make_node("Relu", ["s1"], ["b_out"])], "then", [], [body_out])
        other = helper.make_graph([helper.make_node("Neg", ["s1"], ["b_out"])], "else", [], [body_out])
        nodes.append(helper.make_node("If", ["cond"], ["sub"], then_branch=then, else_branch=other))
        inputs = [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])]
    else:
        body = helper.make_graph(  # the body reads s1 too
            [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Add", ["acc", "s1"], ["acc_out"])],
            "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                     helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                     helper.make_tensor_value_info("acc", TensorProto.FLOAT, [1, 16, HIDDEN])],
            [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 16, HIDDEN])])
        nodes.append(helper.make_node("Loop", ["trip", "", "y"], ["sub"], body=body))
        inputs = [helper.make_tensor_value_info("trip", TensorProto.INT64, [])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, HIDDEN]), *inputs],
                       [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 16, HIDDEN]) for n in ("sub", "y")],
                       inits)
    onnx.checker.check_model(model, full_check=True)
    src, out = work / f"{kind}.onnx", work / "out.onnx"
    onnx.save(model, src)
    before = snapshot(work)
    result = optimize(src, out, rules, "--keep-if-slower")
    x = np.random.default_rng(0).standard_normal((1, 16, HIDDEN)).astype(np.float32)
    extra = {"cond": np.array(True)} if kind == "If" else {"trip": np.array(3, dtype=np.int64)}
    written = assert_passes_through(result, src, out, before, work, {"x": x, **extra})
    assert "cancel-concat-split" in result.output  # the rule fired (the summary names it by what it does)
    sub = next(n for n in written.graph.node if n.op_type == kind)
    original = next(n for n in model.graph.node if n.op_type == kind)
    assert sub.attribute == original.attribute  # subgraphs untouched


def test_zero_size_tensors(env):
    work, rules = env
    model = cancel_model(dims=(0, 16, HIDDEN))
    src, out = work / "zero.onnx", work / "out.onnx"
    onnx.save(model, src)
    before = snapshot(work)
    result = optimize(src, out, rules, "--keep-if-slower")
    assert_passes_through(result, src, out, before, work, {"x": np.zeros((0, 16, HIDDEN), np.float32)})


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT16, TensorProto.DOUBLE])
def test_other_float_types_are_optimized(env, dtype):
    work, rules = env
    model = cancel_model(dtype)
    src, out = work / "m.onnx", work / "out.onnx"
    onnx.save(model, src)
    before = snapshot(work)
    result = optimize(src, out, rules, "--keep-if-slower")
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    x = np.random.default_rng(0).standard_normal((1, 16, HIDDEN)).astype(np_dtype)
    written = assert_passes_through(result, src, out, before, work, {"x": x})
    assert "cancel-concat-split x1" in result.output
    assert all(t.data_type == dtype for t in written.graph.initializer if t.name.startswith("xf_"))


def test_input_random_values_cannot_fill_passes_through(env):
    """A sequence input: the equivalence check has no inputs to run the rewritten model on, so the
    original is written (and the run says why) rather than an unverified rewrite."""
    work, rules = env
    nodes, inits = cancel()
    nodes.append(helper.make_node("SequenceLength", ["seq"], ["count"]))
    seq = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, [2])
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, HIDDEN]), seq],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, HIDDEN]),
                        helper.make_tensor_value_info("count", TensorProto.INT64, [])], inits)
    result = copied_unchanged(work, rules, model)
    assert "random inputs cannot fill" in result.output and "copied through unchanged" in result.output


def test_int8_quantized_model_passes_through(env):
    """Integer and quantized ops are outside the op table: the model is carried through unchanged."""
    work, rules = env
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.integers(-100, 100, (8, 8)).astype(np.int8), "w")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("MatMulInteger", ["xq", "w", "z", "wz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Relu", ["accf"], ["y"])]
    inits = [w, numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z"), numpy_helper.from_array(np.array(0, np.int8), "wz")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
    copied_unchanged(work, rules, model, {"x": rng.standard_normal((4, 8)).astype(np.float32)})


# ---- output-side failures ---------------------------------------------------------------------------


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_unwritable_output_directory(env, tmp_path):
    work, rules = env
    src = work / "m.onnx"
    onnx.save(cancel_model(), src)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    before = snapshot(work)
    try:
        result = optimize(src, locked / "out.onnx", rules)
        assert result.exit_code == 2 and "not writable" in result.stderr
        assert snapshot(work) == before and not os.listdir(locked)
    finally:
        locked.chmod(0o755)


class _FailingFile:
    """A binary file whose writes raise ``error`` once ``limit`` bytes have gone through."""

    def __init__(self, f, limit: int, error: BaseException) -> None:  # noqa: ANN001
        self.f, self.limit, self.error = f, limit, error

    def write(self, data: bytes) -> int:
        if self.f.tell() + len(data) > self.limit:
            self.f.write(bytes(data)[: max(0, self.limit - self.f.tell())])
            raise self.error
        return self.f.write(data)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.f, name)

    def __enter__(self):  # noqa: ANN204
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def failing_open(limit: int, error: BaseException, target: str = ""):  # noqa: ANN201
    """An ``open`` whose files written under a name containing ``target`` fail after ``limit`` bytes."""
    real = open

    def fake(path, mode="r", *args, **kwargs):  # noqa: ANN001, ANN202
        f = real(path, mode, *args, **kwargs)
        if "w" in mode and target in os.path.basename(path):
            return _FailingFile(f, limit, error)
        return f

    return fake


@pytest.mark.parametrize("where", ["model", "data", "scratch"])
@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EACCES], ids=["disk-full", "permission"])
def test_write_failing_midway_leaves_nothing(env, monkeypatch, where, err):
    """The disk fills up (or a permission error strikes) while the model, its external data file or
    the scratch copy that is verified is written: one line naming the output, exit 2, no partial
    output and no temp file, the input untouched."""
    work, rules = env
    model, _ = weighted_model()
    src, out = work / "m.onnx", work / "out.onnx"
    if where != "model":  # the weight goes to m.onnx.data (ORT reads shape tensors only when inline)
        onnx.save(model, src, save_as_external_data=True, location="m.onnx.data", size_threshold=256)
    else:
        onnx.save(model, src)
    out.write_bytes(b"the previous output stays as it was")
    before = snapshot(work)
    target = {"model": "out.onnx", "data": "out.onnx.data", "scratch": "candidate"}[where]
    monkeypatch.setattr(SAVE_MODULE, "open", failing_open(100, OSError(err, os.strerror(err)), target), raising=False)
    result = optimize(src, out, rules, "--keep-if-slower")
    assert_refused(result, out, before, work, "cannot write")


def test_previous_output_with_data_survives_a_failed_rename(env, monkeypatch):
    """The new data file is renamed into place first, then the model: when the model's rename fails
    (or Ctrl-C strikes between the two), the previous output's data file is put back, so the previous
    out.onnx still loads with its own weights."""
    work, rules = env
    model, _ = weighted_model()
    src, out = work / "m.onnx", work / "out.onnx"
    onnx.save(model, src, save_as_external_data=True, location="m.onnx.data", size_threshold=256)
    assert optimize(src, out, rules).exit_code == 0 and (work / "out.onnx.data").exists()  # the previous output
    before = snapshot(work)
    real_replace = os.replace

    def replace(a, b):  # noqa: ANN001, ANN202
        if os.fspath(b) == str(out):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_replace(a, b)

    monkeypatch.setattr(os, "replace", replace)
    assert_refused(optimize(src, out, rules), out, before, work, "cannot write")
    x = np.ones((1, 16, HIDDEN), np.float32)
    assert len(ort.InferenceSession(str(out)).run(None, {"x": x})) == 2


# ---- what is written, what is said, what a killed run leaves (issue 22) -------------------------------


def cancel_input(env) -> tuple:  # noqa: ANN001
    """(work folder, rules file, the cancel model saved as work/m.onnx, a snapshot of the folder)."""
    work, rules = env
    src = work / "m.onnx"
    onnx.save(cancel_model(), src)
    return work, rules, src, snapshot(work)


@pytest.mark.parametrize("device", ["/dev/null", "/dev/full"])
def test_output_that_is_a_device_is_refused(env, device):
    """A device is not replaced by a regular file (as root that would break the machine)."""
    work, rules, src, before = cancel_input(env)
    assert_refused(optimize(src, device, rules), device, before, work, "character device")
    assert os.path.exists(device) and not os.path.isfile(device)


def test_output_that_is_a_fifo_is_refused(env):
    work, rules, src, _ = cancel_input(env)
    fifo = work / "pipe.onnx"
    os.mkfifo(fifo)
    before = snapshot(work)
    assert_refused(optimize(src, fifo, rules), fifo, before, work, "FIFO")


@pytest.mark.skipif(not os.path.isdir("/proc/self") or not os.path.isdir("/sys/kernel"),
                    reason="needs Linux's /proc and /sys")
@pytest.mark.parametrize("out", ["/proc/xflow-out.onnx", "/sys/kernel/xflow-out.onnx"])
def test_output_on_a_kernel_file_system_is_refused(env, out):
    work, rules, src, before = cancel_input(env)
    assert_refused(optimize(src, out, rules), out, before, work, "file system")


@pytest.mark.parametrize("cost_db, needle", [("/dev/full", "character device"),
                                             ("m.onnx/costs.sqlite", "is a file, not a directory")],
                         ids=["device", "parent-is-a-file"])
def test_cost_db_that_cannot_be_one(env, cost_db, needle):
    """Nothing is created beside a --cost-db that cannot be a database (SQLite would add a -journal)."""
    work, rules, src, _ = cancel_input(env)
    cost_db = cost_db if cost_db.startswith("/") else str(work / cost_db)
    journal_before = os.path.exists(cost_db + "-journal")
    before = snapshot(work)
    result = run(str(src), str(work / "out.onnx"), "--rules", rules, "--cost-db", cost_db, "--budget", "5")
    assert_refused(result, cost_db, before, work, needle)
    assert os.path.exists(cost_db + "-journal") == journal_before


def reshape_model() -> onnx.ModelProto:
    """y = reshape(x, [8]) with x of shape [N, 4]: runs only when N == 2."""
    return make_model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
                      [numpy_helper.from_array(np.array([8], np.int64), "shape")])


@pytest.mark.parametrize("rules_kind", ["no-rules", "rules"])
def test_ort_failing_on_the_inputs_writes_nothing_and_prints_no_raw_log(env, rules_kind):
    """ORT fails while running the user's inputs: exit 2 with one line that quotes ORT's message whole
    (not its own log lines), and no OUT, whether or not anything was rewritten."""
    work, rules = env
    if rules_kind == "no-rules":
        (work.parent / "none.json").write_text(json.dumps({"format": "xflow.rules/1", "rules": []}))
        rules = str(work.parent / "none.json")
    src, npz = work / "m.onnx", work / "inputs.npz"
    onnx.save(reshape_model(), src)
    np.savez(npz, x=np.zeros((3, 4), np.float32))
    before = snapshot(work)
    proc = subprocess.run([sys.executable, "-m", "xflow.cli", "optimize", str(src), str(work / "out.onnx"),
                           "--rules", rules, "--cost", "analytic", "--inputs", str(npz)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xflow: error: ") and str(npz) in lines[0], proc.stderr
    assert "requested shape:{8}" in lines[0]  # ORT's message to its end
    assert snapshot(work) == before


def test_original_written_is_a_byte_for_byte_copy(env):
    """Kept unchanged, the model written is the input's bytes: unused initializers, value_info, doc
    strings and metadata survive, and the report says it is a copy with the file's node count."""
    work, rules = env
    model = cancel_model()
    model.graph.initializer.append(numpy_helper.from_array(np.ones(3, np.float32), "unused"))
    model.graph.value_info.append(helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 16, HIDDEN]))
    model.doc_string = "kept"
    (work.parent / "none.json").write_text(json.dumps({"format": "xflow.rules/1", "rules": []}))
    src, out, report = work / "m.onnx", work / "out.onnx", work.parent / "report.json"
    onnx.save(model, src)
    result = optimize(src, out, str(work.parent / "none.json"), "--report", str(report))
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == src.read_bytes()
    data = json.loads(report.read_text())
    assert data["copied"] and data["decision"] == "copied (no rules)"
    assert data["nodes_before"] == data["nodes_after"] == len(model.graph.node)


def test_node_counts_are_the_written_files(env):
    """The summary's and the report's node counts are the ONNX nodes of the input and of the file
    written; the IR's own counts are reported under their own names."""
    work, rules = env
    src, out, report = work / "m.onnx", work / "out.onnx", work.parent / "report.json"
    model = cancel_model()
    model.graph.node.append(helper.make_node("Gemm", ["w", "w"], ["g"], name="gemm"))
    model.graph.initializer.append(numpy_helper.from_array(np.ones((4, 4), np.float32), "w"))
    model.graph.output.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, [4, 4]))
    onnx.save(model, src)
    result = optimize(src, out, rules, "--keep-if-slower", "--report", str(report))
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    written = onnx.load(str(out))
    assert data["nodes_before"] == len(model.graph.node) and data["nodes_after"] == len(written.graph.node)
    assert data["decision"] == "optimized" and data["nodes_after"] < data["nodes_before"]
    assert data["ir_nodes_before"] > 0 and data["ir_nodes_after"] > 0
    assert f"{data['nodes_before']} nodes -> {data['nodes_after']} nodes" in result.output


def test_a_killed_runs_scratch_folder_is_removed_by_the_next_run(env):
    """A run killed mid-way leaves its folder ``.xflow-run-<pid>-<start>``; the next run writing into that
    directory removes it once no process has that pid and start time, keeps a live run's folder, and
    leaves none of its own."""
    from xflow.files import RUN_PREFIX, _start_ticks

    work, rules = env
    src = work / "m.onnx"
    onnx.save(cancel_model(), src)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = work / f"{RUN_PREFIX}{dead.pid}-{_start_ticks(os.getpid()) or 1}"
    stale.mkdir()
    (stale / "finalist0.onnx").write_bytes(b"x" * 1000)
    live = work / f"{RUN_PREFIX}{os.getpid()}-{_start_ticks(os.getpid())}.0a"
    live.mkdir()
    result = optimize(src, work / "out.onnx", rules)
    assert result.exit_code == 0, result.output
    assert not stale.exists() and live.exists()
    assert sorted(p.name for p in work.iterdir()) == sorted(["m.onnx", "out.onnx", live.name])


def test_rules_stats_given_a_rule_file_for_a_model(tmp_path):
    """``xflow rules stats`` given a rules JSON where a model is expected: one line, exit 2."""
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(RULES))
    result = CliRunner().invoke(main, ["rules", "stats", str(rules), "--rules", str(rules)], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(rules) in lines[0] and "not an ONNX model" in lines[0], result.stderr


def test_unsorted_model_message_is_whole(env):
    """onnx's checker message spans lines; the one line quotes it to its end."""
    work, rules = env
    src = work / "m.onnx"
    nodes = [helper.make_node("Relu", ["r"], ["y"], name="second"),
             helper.make_node("Relu", ["x"], ["r"], name="first")]
    onnx.save(make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]), src)
    before = snapshot(work)
    result = optimize(src, work / "out.onnx", rules)
    assert_refused(result, src, before, work, "topologically sorted")
    assert "is not output of any previous nodes" in result.stderr


def write_wrong_dims(npz) -> None:  # noqa: ANN001
    np.savez(npz, x=np.zeros((1, 3, HIDDEN), np.float32))


@pytest.mark.parametrize("write, needles", [
    (write_wrong_dims, ("cannot run", "index: 1 Got: 3 Expected: 16")),  # ORT's whole message, indices included
    (lambda npz: npz.write_text("x = 1, 2, 3\n"), ("not an .npz file",)),  # not numpy's words about pickles
], ids=["wrong-dims", "text-file"])
def test_inputs_messages_are_whole_and_say_what_is_wrong(env, write, needles):
    work, rules, src, _ = cancel_input(env)
    npz = work / "inputs.npz"
    write(npz)
    before = snapshot(work)
    result = optimize(src, work / "out.onnx", rules, "--inputs", str(npz))
    assert_refused(result, npz, before, work, needles[0])
    assert all(n in result.stderr for n in needles) and "pickle" not in result.stderr


@pytest.mark.parametrize("command", ["report", "zoo"])
def test_other_outputs_that_are_devices_are_refused(env, command):
    """Every file a command writes is held to the same rule as OUT (the report, a zoo model)."""
    work, rules, src, before = cancel_input(env)
    if command == "report":
        result = optimize(src, work / "out.onnx", rules, "--report", "/dev/full")
    else:
        result = CliRunner().invoke(main, ["zoo", "squeezenet", "/dev/full", "--small"], catch_exceptions=False)
    assert_refused(result, "/dev/full", before, work, "character device")


# ---- issue #59: a file named twice, a file that is not a cost database ---------------------------------


def weights_input(env) -> tuple:  # noqa: ANN001
    """(work folder, rules file, work/m.onnx with its weight in work/m.onnx.data, a snapshot of the folder)."""
    work, rules = env
    model, _ = weighted_model()
    src = work / "m.onnx"
    onnx.save(model, src, save_as_external_data=True, location="m.onnx.data", size_threshold=256)
    return work, rules, src, snapshot(work)


@pytest.mark.parametrize("named", ["input", "rules", "output", "inputs-npz", "report", "weights"])
def test_cost_db_naming_a_file_the_run_reads_or_writes_is_refused(env, named):
    """#59 defect 1: ``--cost-db in.onnx`` moved the model aside and put a database in its place; every file
    the run reads or writes (the rule file, OUT, --inputs, --report, the input's weights file) is refused as
    a cost database in one line, and nothing anywhere changes."""
    work, rules, src, _ = weights_input(env)
    npz = work / "inputs.npz"
    np.savez(npz, x=np.zeros((1, 16, HIDDEN), np.float32))
    out = work / "out.onnx"
    out.write_bytes(b"a previous output")
    report = work / "report.json"
    report.write_text("{}")
    target = {"input": str(src), "rules": rules, "output": str(out), "inputs-npz": str(npz),
              "report": str(report), "weights": str(work / "m.onnx.data")}[named]
    extra = {"inputs-npz": ["--inputs", str(npz)], "report": ["--report", str(report)]}.get(named, [])
    whole = work.parent
    before = snapshot(whole)
    result = run(str(src), str(out), "--rules", rules, "--budget", "5", "--cost-db", target, *extra)
    assert_refused(result, target, before, whole, "--cost-db")
    assert not os.path.exists(target + "-wal") and not os.path.exists(target + "-shm")


@pytest.mark.parametrize("kind, needle", [("model", "an ONNX model"), ("json", "a JSON file"),
                                          ("npz", "a zip archive"), ("text", "a text file")])
def test_cost_db_that_is_plainly_another_file_is_refused_and_kept(env, kind, needle):
    """#59 defect 1: a cost database that is not one used to be moved aside by design; a file that is plainly
    something else (a model, JSON, an .npz, text) is no damaged database: refused in one line, left as it is."""
    work, rules, src, _ = cancel_input(env)
    other = work / f"other.{kind}"
    if kind == "model":
        onnx.save(cancel_model(), other)
    elif kind == "json":
        other.write_text(json.dumps(RULES))
    elif kind == "npz":
        np.savez(other, x=np.zeros(3))  # the name ends in .npz: numpy adds nothing
    else:
        other.write_text("costs, I think\n")
    before = snapshot(work)
    result = run(str(src), str(work / "out.onnx"), "--rules", rules, "--budget", "5", "--cost-db", str(other))
    assert_refused(result, other, before, work, needle)


def test_cost_db_that_is_a_directory_is_one_line(env):
    """#59 defect 8: ``--cost-db DIR`` gave click's three-line usage error."""
    work, rules, src, _ = cancel_input(env)
    folder = work / "costs"
    folder.mkdir()
    before = snapshot(work)
    result = run(str(src), str(work / "out.onnx"), "--rules", rules, "--budget", "5", "--cost-db", str(folder))
    assert_refused(result, folder, before, work, "is a directory")


@pytest.mark.parametrize("schema, columns, needle", [
    ("99", "key TEXT PRIMARY KEY, seconds REAL NOT NULL, op TEXT NOT NULL, env TEXT NOT NULL, detail TEXT NOT NULL, "
           "created REAL NOT NULL", "newer than"),
    ("1", "key TEXT PRIMARY KEY, cost REAL", "its costs table has columns key, cost"),
], ids=["newer-schema", "other-columns"])
def test_cost_db_this_code_cannot_use_is_refused_not_used(env, schema, columns, needle):
    """#59 defects 7 and 8: a database of a newer schema was used silently; one whose ``costs`` table has other
    columns gave a traceback. Both are refused in one line, the database unchanged."""
    import sqlite3

    work, rules, src, _ = cancel_input(env)
    db = work / "costs.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('schema', ?)", (schema,))
    conn.execute(f"CREATE TABLE costs ({columns})")
    conn.commit()
    conn.close()
    before = snapshot(work)
    result = run(str(src), str(work / "out.onnx"), "--rules", rules, "--budget", "5", "--cost-db", str(db))
    assert_refused(result, db, before, work, needle)


@pytest.mark.parametrize("report", ["plan", "out-data"])
def test_report_naming_another_output_is_refused(env, report):
    """#59 defect 8: ``--report`` naming the plan file silently overwrote the plan (and the output's data file
    is the next file a user might name twice)."""
    work, rules, src, before = cancel_input(env)
    path = work / ("out.plan.json" if report == "plan" else "out.onnx.data")
    result = optimize(src, work / "out.onnx", rules, "--report", str(path), "--place", "cpu")
    assert_refused(result, path, before, work, "--report")


def test_report_into_a_full_disk_leaves_no_output(env, monkeypatch):
    """#59 defect 5: ``--report`` into a full file system exited 2 after OUT was written. Every output is
    written or none: OUT (and a previous OUT) is as it was before the run."""
    files_module = importlib.import_module("xflow.files")
    work, rules, src, _ = cancel_input(env)
    out = work / "out.onnx"
    out.write_bytes(b"the previous output stays as it was")
    before = snapshot(work)
    real = open

    def full_disk(path, mode="r", *args, **kwargs):  # noqa: ANN001, ANN202 - the report's writes fail
        f = real(path, mode, *args, **kwargs)
        if "w" in mode and "report.json" in os.path.basename(path):
            def write(_data: str) -> int:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            f.write = write
        return f

    monkeypatch.setattr(files_module, "open", full_disk, raising=False)
    result = optimize(src, out, rules, "--keep-if-slower", "--report", str(work / "report.json"))
    assert_refused(result, work / "report.json", before, work, "No space left on device")


def test_written_output_keeps_a_private_inputs_mode(env):
    """#59 defect 8: OUT written from a 0600 model was 0644; like ``cp``, it keeps the input's mode."""
    work, rules, src, _ = cancel_input(env)
    os.chmod(src, 0o600)
    for extra in ([], ["--keep-if-slower"]):  # the original copied, and the optimized model written
        out = work / f"out{len(extra)}.onnx"
        assert optimize(src, out, rules, *extra).exit_code == 0
        assert os.stat(out).st_mode & 0o777 == 0o600, oct(os.stat(out).st_mode)


def test_input_name_with_a_newline_is_one_line(env):
    """#59 defect 8: a name holding a newline split the error in two lines."""
    work, rules, src, before = cancel_input(env)
    result = optimize(src, work / "out.onnx", rules, "--input-shape", "no\nsuch=1x2")
    assert_refused(result, "", before, work, "no\\nsuch")


# ---- issue #59: rule files that are not shaped as rules, expressions that compute without bound -------


def _rule_file(tmp_path, rules) -> str:  # noqa: ANN001
    path = tmp_path / "bad-rules.json"
    path.write_text(json.dumps({"format": "xflow.rules/1", "rules": rules}))
    return str(path)


BAD_RULES = {
    "entry-not-an-object": ["x"],
    "inputs-a-list": [{**MATMUL_MERGE, "inputs": ["x", "a", "b"]}],
    "name-a-list": [{**MATMUL_MERGE, "name": ["m"]}],
    "src-an-object": [{**MATMUL_MERGE, "src": {"op": "matmul"}}],
    "node-in-a-string-list": [{**MATMUL_MERGE, "src": [{"op": "matmul", "in": [1, 2], "out": ["y1"]}]}],
    "attrs-a-list": [{**CONV_RELU_FOLD, "src": [{**CONV_RELU_FOLD["src"][0], "attrs": [1]}]}],
    "where-a-number": [{**MATMUL_MERGE, "where": [3]}],
    "deeply-nested-where": [{**MATMUL_MERGE, "where": ["-" * 100_000 + "1 < 0"]}],
    "attr-an-object": [{**CONV_RELU_FOLD, "src": [{**CONV_RELU_FOLD["src"][0], "attrs": {"strides": {"a": 1}}},
                                                  *CONV_RELU_FOLD["src"][1:]]}],
    "name-a-number": [{**MATMUL_MERGE, "name": 3}],
}


@pytest.mark.parametrize("command", ["optimize", "verify-rules"])
@pytest.mark.parametrize("case", sorted(BAD_RULES))
def test_rule_file_not_shaped_as_rules_is_one_line(env, tmp_path, command, case):
    """#59 defect 7: rule entries that are not objects, ``inputs`` as a list, a name that is a list, a `where`
    of 100,000 nested minuses gave tracebacks (exit 1), in optimize and verify-rules alike."""
    work, _, src, before = cancel_input(env)
    rules = _rule_file(tmp_path, BAD_RULES[case])
    args = ["optimize", str(src), str(work / "out.onnx"), "--rules", rules, "--cost", "analytic"] \
        if command == "optimize" else ["verify-rules", rules, "--jobs", "1"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert_refused(result, rules, before, work, "")


def test_expression_that_allocates_without_bound_is_stopped():
    """#59 defect 7: ``len('a' * 100000000000) > 0`` passes the whitelist and allocated without bound at match
    time; what an expression may compute is bounded (a sequence of at most MAX_ITEMS items)."""
    from xflow.rules.expr import MAX_ITEMS, Expr, ExprError, ShapeEnv

    env = ShapeEnv({}, {})
    for source in ("len('a' * 100000000000) > 0", "len((1,) * 100000000000)", "sum(((1,) * 9999,) * 9999, ())",
                   "len('%0999999999d' % 1)"):
        with pytest.raises(ExprError):
            Expr(source).evaluate(env)
    assert Expr(f"len('ab' * {MAX_ITEMS // 2})").evaluate(env) == MAX_ITEMS


def test_rule_whose_where_allocates_without_bound_is_refused_by_name(env, tmp_path):
    """The same condition in a user's rule: it cannot be checked (no instance evaluates it), so the rule is
    refused by name, in one line, quickly."""
    work, _, src, before = cancel_input(env)
    rules = _rule_file(tmp_path, [{**CONCAT_SPLIT_CANCEL, "where": ["len('a' * 100000000000) > 0"]}])
    result = optimize(src, work / "out.onnx", rules)
    assert_refused(result, rules, before, work, CONCAT_SPLIT_CANCEL["name"])


def test_external_data_shorter_than_the_model_says_is_one_line(env):
    """#59 defect 7: an external data file shorter than the model says; refused when the model is read."""
    work, rules, src, _ = weights_input(env)
    with open(work / "m.onnx.data", "r+b") as f:
        f.truncate(100)
    before = snapshot(work)
    assert_refused(optimize(src, work / "out.onnx", rules), work / "m.onnx.data", before, work, "shorter")


# ---- issue #59: the written interface, inputs random values must fill ------------------------------------


def overridable_model(ir_version: int, opset: int) -> onnx.ModelProto:
    """y1 = x @ a, y2 = x @ b, where the weights a and b are initializers that are also graph inputs (a caller
    may feed them: overridable at IR >= 4; at IR 3 every initializer is listed among the inputs)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32), n) for n in "ab"]
    nodes = [helper.make_node("MatMul", ["x", "a"], ["y1"]), helper.make_node("MatMul", ["x", "b"], ["y2"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
              for n, shape in (("x", ["batch", HIDDEN]), ("a", [HIDDEN, HIDDEN]), ("b", [HIDDEN, HIDDEN]))]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", HIDDEN]) for n in ("y1", "y2")]
    return make_model(nodes, inputs, outputs, inits, opset=opset, ir_version=ir_version)


def interface(model: onnx.ModelProto) -> list:
    return [(vi.name, vi.type.SerializeToString()) for vi in (*model.graph.input, *model.graph.output)]


@pytest.mark.parametrize("ir_version, opset", [(8, 17), (3, 7)], ids=["ir8", "ir3"])
def test_overridable_initializers_stay_inputs(env, ir_version, opset):
    """#59 defect 4: after a matmul merge the written model's inputs lost ``a`` and ``b`` (a caller feeding them
    got "Invalid input name"); at IR 3 they were replaced by a new input ``xf_...``. An initializer a caller may
    feed is an input: the merge is no match, and the written model keeps the interface exactly."""
    work, rules = env
    model = overridable_model(ir_version, opset)
    src, out = work / "m.onnx", work / "out.onnx"
    onnx.save(model, src)
    before = snapshot(work)
    result = optimize(src, out, rules, "--keep-if-slower", "--input-shape", "x=4x8")
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((4, HIDDEN)).astype(np.float32)}
    if ir_version >= 4:  # ONNX Runtime lets a caller feed them from IR 4 on (before, it reads them as constants)
        feeds.update({n: rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) for n in "ab"})
    written = assert_passes_through(result, src, out, before, work, feeds)
    assert interface(written) == interface(model)
    assert sorted(t.name for t in written.graph.initializer) == ["a", "b"]


def test_rank0_bool_input_is_checked_not_copied(env):
    """#59 defect 6: a rank-0 bool input (an If condition) was drawn as a numpy scalar ORT refuses, so every
    model with one was "not runnable" and copied; it is drawn as a rank-0 array and the rewrite is verified."""
    from xflow.ort import open_session
    from xflow.runtime import random_feeds

    work, rules = env
    nodes, inits = cancel()
    body_out = helper.make_tensor_value_info("b_out", TensorProto.FLOAT, [1, 16, HIDDEN])
    then = helper.make_graph([helper.make_node("Relu", ["y"], ["b_out"])], "then", [], [body_out])
    other = helper.make_graph([helper.make_node("Neg", ["y"], ["b_out"])], "else", [], [body_out])
    nodes.append(helper.make_node("If", ["cond"], ["sub"], then_branch=then, else_branch=other))
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, HIDDEN]),
                               helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                       [helper.make_tensor_value_info("sub", TensorProto.FLOAT, [1, 16, HIDDEN])], inits)
    feeds = random_feeds(open_session(model))
    assert all(isinstance(v, np.ndarray) for v in feeds.values()) and feeds["cond"].shape == ()
    src, out = work / "if.onnx", work / "out.onnx"
    onnx.save(model, src)
    result = run(str(src), str(out), "--rules", rules, "--cost", "analytic", "--keep-if-slower", "--report",
                 str(work / "r.json"))
    assert result.exit_code == 0, (result.output, result.stderr)
    report = json.loads((work / "r.json").read_text())
    assert report["verified"] and report["decision"] == "optimized", report["decision"]
    assert report["verify_scales"] == ["wide random inputs", "large random inputs"]


def test_api_names_bytes_as_bytes_not_their_repr():
    """#59 defect 8: ``xflow.optimize(bytes)`` named the bytes' repr as its "path"."""
    import xflow
    from xflow.errors import XflowError

    with pytest.raises(XflowError) as caught:
        xflow.optimize(b"\x08\x07 not a model at all" * 100, cost="analytic")
    assert str(caught.value).startswith("<bytes>: ") and "\\x08" not in str(caught.value)
    model = cancel_model()
    out = xflow.optimize(model.SerializeToString(), cost="analytic", keep_if_slower=True, measure=False)
    assert isinstance(out, onnx.ModelProto) and interface(out) == interface(model)


@pytest.mark.parametrize("case", ["out-is-rules", "out-is-inputs", "report-is-inputs", "report-is-rules"])
def test_optimize_outputs_naming_what_it_reads_are_refused(env, case):
    """The next files a user might name twice: OUT or ``--report`` naming the rule file or ``--inputs``."""
    work, rules, src, _ = cancel_input(env)
    npz = work / "inputs.npz"
    np.savez(npz, x=np.zeros((1, 16, HIDDEN), np.float32))
    out = {"out-is-rules": rules, "out-is-inputs": str(npz)}.get(case, str(work / "out.onnx"))
    report = {"report-is-inputs": str(npz), "report-is-rules": rules}.get(case)
    whole = work.parent
    before = snapshot(whole)
    result = optimize(src, out, rules, "--inputs", str(npz), *(["--report", report] if report else []))
    assert_refused(result, report or out, before, whole, "")
    assert "named as both" in result.stderr or "--report names" in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["verify-rules", "denormals", "generate-rules"])
def test_other_commands_refuse_to_write_over_what_they_read(env, command):
    """verify-rules' ``--report`` over its rule file, denormals' ``--json`` over its model, generate-rules'
    ``--out`` over its ``--candidates``: refused in one line, the file kept."""
    work, rules, src, _ = cancel_input(env)
    args = {"verify-rules": ["verify-rules", rules, "--report", rules, "--jobs", "1"],
            "denormals": ["denormals", str(src), "--json", str(src)],
            "generate-rules": ["generate-rules", "--candidates", rules, "--out", rules, "--jobs", "1"]}[command]
    whole = work.parent
    before = snapshot(whole)
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert_refused(result, rules if command != "denormals" else src, before, whole, "named as both")

"""Manual check: real PyTorch exports of small transformer models survive xflow's ONNX load/save.

Not a test and not a project dependency: it needs torch, transformers, onnxscript and onnxruntime in
a separate environment, for example::

    python3 -m venv /tmp/exp
    /tmp/exp/bin/pip install torch transformers onnx onnxruntime onnxscript
    PYTHONPATH=. /tmp/exp/bin/python benchmarks/check_real_exports.py

For randomly initialized tiny BERT, ViT and GPT-2 models (``from_config``; nothing is downloaded),
exported with the legacy TorchScript exporter (``dynamo=False``) and the dynamo exporter
(``dynamo=True``) with dynamic batch/sequence dims, it loads each model with ``xflow.onnx_io.load``
(as is, and with every input's dims fixed the way ``--input-shape`` does), saves it with
``reuse_protos`` True and False, runs ``onnx.checker`` on the written file and compares ONNX Runtime
outputs of the original and the written model. Per row: ONNX nodes, how many decoded into the op
table / stayed opaque, IR nodes, the largest absolute output difference from the original,
whether the outputs are bitwise equal to the original's (for fixed shapes: to the original with
the same input dims fixed by hand, since ONNX Runtime may run static shapes with other kernels),
and load and save times.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from xflow.onnx_io import load, save  # noqa: E402

BATCH, SEQ = 2, 8


@dataclass
class Spec:
    name: str
    module: torch.nn.Module
    inputs: dict[str, torch.Tensor]
    dynamic: dict[str, dict[int, str]]  # input name -> {axis: dim name}


class LastHidden(torch.nn.Module):
    """Return only last_hidden_state, so both exporters see a plain tensor output."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        names = self.input_names
        return self.model(**dict(zip(names, args, strict=True))).last_hidden_state


def build_specs(names: list[str]) -> list[Spec]:
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model, ViTConfig, ViTModel

    torch.manual_seed(0)
    specs: list[Spec] = []
    ids = torch.randint(0, 100, (BATCH, SEQ))
    mask = torch.ones(BATCH, SEQ, dtype=torch.int64)
    mask[1, SEQ - 3:] = 0
    text_dyn = {0: "batch", 1: "seq"}
    if "bert" in names:
        config = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=128, max_position_embeddings=64, attn_implementation="eager")
        specs.append(Spec("bert", BertModel(config), {"input_ids": ids, "attention_mask": mask},
                          {"input_ids": text_dyn, "attention_mask": text_dyn}))
    if "vit" in names:
        config = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=128, attn_implementation="eager")
        specs.append(Spec("vit", ViTModel(config, add_pooling_layer=False),
                          {"pixel_values": torch.randn(BATCH, 3, 32, 32)}, {"pixel_values": {0: "batch"}}))
    if "gpt2" in names:
        config = GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False,
                            attn_implementation="eager")
        specs.append(Spec("gpt2", GPT2Model(config), {"input_ids": ids, "attention_mask": mask},
                          {"input_ids": text_dyn, "attention_mask": text_dyn}))
    for spec in specs:
        spec.module.eval()
    return specs


def export(spec: Spec, exporter: str, path: str, opset: int) -> None:
    wrapper = LastHidden(spec.module).eval()
    wrapper.input_names = list(spec.inputs)
    args = tuple(spec.inputs.values())
    names = list(spec.inputs)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            dynamic_axes = dict(spec.dynamic) | {"last_hidden_state": {0: "batch", 1: "seq"}}
            torch.onnx.export(wrapper, args, path, dynamo=False, opset_version=opset, input_names=names,
                              output_names=["last_hidden_state"], dynamic_axes=dynamic_axes)
        else:
            dims = {axis_name: torch.export.Dim(axis_name, min=1, max=64)
                    for d in spec.dynamic.values() for axis_name in d.values()}
            # forward(*args): the dynamic shapes of the one varargs parameter, a tuple of per-input specs
            dynamic_shapes = (tuple({axis: dims[n] for axis, n in spec.dynamic[name].items()} for name in names),)
            program = torch.onnx.export(wrapper, args, dynamo=True, opset_version=opset, input_names=names,
                                        output_names=["last_hidden_state"], dynamic_shapes=dynamic_shapes)
            program.save(path)


def run(path: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]).run(None, feeds)


def check(spec: Spec, exporter: str, workdir: str, opset: int) -> list[dict]:
    src = os.path.join(workdir, f"{spec.name}_{exporter}.onnx")
    export(spec, exporter, src, opset)
    feeds = {name: t.numpy() for name, t in spec.inputs.items()}
    source = onnx.load(src, load_external_data=False)
    feeds = {k: v for k, v in feeds.items() if k in {i.name for i in source.graph.input}}
    expected = run(src, feeds)
    opset_used = next(i.version for i in source.opset_import if i.domain in ("", "ai.onnx"))
    # The same model with its input dims fixed by hand: ONNX Runtime may pick other kernels when shapes
    # are static, so a fixed-shape save is compared bitwise against this, and with a tolerance against
    # the dynamic original.
    pinned = onnx.load(src, load_external_data=False)
    for vi in pinned.graph.input:
        if vi.name in feeds:
            for d, value in zip(vi.type.tensor_type.shape.dim, feeds[vi.name].shape, strict=True):
                d.Clear()
                d.dim_value = value
    pinned_path = src.replace(".onnx", "_pinned.onnx")
    onnx.save(pinned, pinned_path)
    expected_pinned = run(pinned_path, feeds)
    rows = []
    for fixed in (False, True):
        shapes = {name: tuple(a.shape) for name, a in feeds.items()} if fixed else None
        start = time.perf_counter()
        graph = load(src, input_shapes=shapes)
        load_s = time.perf_counter() - start
        origins = {id(n.origin): n.origin for n in graph.nodes if not n.is_opaque and n.origin is not None}
        opaque = [n for n in graph.nodes if n.is_opaque]
        for reuse in (True, False):
            out = os.path.join(workdir, f"{spec.name}_{exporter}_{'fixed' if fixed else 'dyn'}_{reuse}.onnx")
            start = time.perf_counter()
            save(graph, out, reuse_protos=reuse)
            save_s = time.perf_counter() - start
            onnx.checker.check_model(out, full_check=True)
            got = run(out, feeds)
            diff = max(float(np.max(np.abs(e.astype(np.float64) - g.astype(np.float64))))
                       for e, g in zip(expected, got, strict=True))
            reference = expected_pinned if fixed else expected
            identical = all(np.array_equal(e, g) for e, g in zip(reference, got, strict=True))
            rows.append({
                "model": spec.name, "exporter": exporter, "opset": opset_used,
                "shapes": "fixed" if fixed else "dynamic", "reuse": reuse, "onnx_nodes": len(source.graph.node),
                "decoded": len(origins), "opaque": len(opaque), "ir_nodes": len(graph.nodes),
                "max_abs_diff": diff, "bitwise": identical, "load_s": load_s, "save_s": save_s,
                "decoded_ops": Counter(n.op for n in graph.nodes if not n.is_opaque),
            })
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert", "vit", "gpt2"])
    parser.add_argument("--exporters", nargs="+", default=["legacy", "dynamo"])
    parser.add_argument("--opset", type=int, default=18)
    parser.add_argument("--keep", help="write the exported and saved models here instead of a temp dir")
    args = parser.parse_args()
    ort.set_default_logger_severity(3)
    workdir = args.keep or tempfile.mkdtemp(prefix="xflow_exports_")
    os.makedirs(workdir, exist_ok=True)
    rows, failures = [], []
    for spec in build_specs(args.models):
        for exporter in args.exporters:
            try:
                rows += check(spec, exporter, workdir, args.opset)
            except Exception as exc:  # report and go on with the other models
                failures.append(f"{spec.name}/{exporter}: {type(exc).__name__}: {exc}")
    header = (f"{'model':6} {'exporter':8} {'opset':>5} {'shapes':8} {'reuse':6} {'nodes':>5} {'decoded':>7} "
              f"{'opaque':>6} {'ir':>5} {'max|diff|':>10} {'bitwise':>7} {'load s':>7} {'save s':>7}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['model']:6} {r['exporter']:8} {r['opset']:>5} {r['shapes']:8} {r['reuse']!s:6} "
              f"{r['onnx_nodes']:>5} {r['decoded']:>7} {r['opaque']:>6} {r['ir_nodes']:>5} "
              f"{r['max_abs_diff']:>10.3g} {r['bitwise']!s:>7} {r['load_s']:>7.3f} {r['save_s']:>7.3f}")
    seen = set()
    for r in rows:
        key = (r["model"], r["exporter"], r["shapes"])
        if key not in seen and r["decoded_ops"]:
            seen.add(key)
            print(f"  {'/'.join(key)} decoded: {dict(sorted(r['decoded_ops'].items()))}")
    for f in failures:
        print("FAILED", f)
    bad = [r for r in rows if r["max_abs_diff"] > 1e-4]
    for r in bad:
        print("LARGE DIFF", r["model"], r["exporter"], r["shapes"], r["reuse"], r["max_abs_diff"])
    print(f"models in {workdir}")
    return 1 if failures or bad else 0


if __name__ == "__main__":
    sys.exit(main())

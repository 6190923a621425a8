"""``xflow bench`` on decoders with a KV cache: timed at the decode step ``xflow optimize`` measures at (not every
dynamic dim at 1, which breaks ``total_seq = past_seq + seq``), ORT's transformer optimizer given the attention
sizes the graph tells, and a peer whose outputs drift at that step flagged."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import helper

from tests.rulebook import MATMUL_MERGE
from xflow.bench import (
    ORIGINAL,
    ORT_TRANSFORMERS,
    XFLOW,
    BenchSettings,
    _ort_transformers_peer,
    attention_sizes,
    bench_point,
    output_drift,
    run_bench,
)
from xflow.ort import open_session
from xflow.runtime import random_feeds
from xflow.zoo.decoder import DecoderConfig, gpt2_decoder, llama_decoder

DECODE_STEP = {"batch": 1, "seq": 1, "past_seq": 127, "total_seq": 128}


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("dec") / "llama.onnx"
    onnx.save(llama_decoder(), path)
    return str(path)


def test_a_decoder_is_timed_at_the_decode_step_with_the_gpt2_optimizer(tmp_path, llama_path):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"format": "xflow.rules/1", "rules": [MATMUL_MERGE]}))
    settings = BenchSettings(rules_path=str(rules), budget=2, seconds_per_model=0.1, min_runs=3,
                             sessions_per_variant=1)
    (row,) = run_bench([llama_path], settings, say=lambda _m: None)
    assert row.timed_at == DECODE_STEP
    assert "timed and checked at batch=1 seq=1 total_seq=128 past_seq=127" in row.notes
    assert row.runs >= 3 and {ORIGINAL, XFLOW} <= set(row.latency_ms)
    # the zoo Llama: hidden 32 over heads of 8 (its cache's last dim), so 4 heads
    assert ORT_TRANSFORMERS in row.speedup, row.notes
    assert "ORT transformer optimizer run as gpt2 with num_heads 4, hidden_size 32" in row.notes
    assert not row.drifted, row.notes


@pytest.mark.parametrize(("build", "cfg", "expected"), [
    (llama_decoder, DecoderConfig(hidden=48, heads=6, kv_heads=2), (6, 48)),
    (gpt2_decoder, DecoderConfig(hidden=48, heads=3, kv_heads=3, max_positions=256), (3, 48)),
])
def test_attention_sizes_are_read_from_the_graph(build, cfg, expected):
    model = build(cfg)
    plan, _ = bench_point(model, "m.onnx")
    assert attention_sizes(model, plan) == expected


def test_sizes_the_graph_does_not_tell_are_asked_for():
    model = llama_decoder()
    # the token ids reach the embedding through an Identity: no Gather of an input tells the hidden size
    for node in model.graph.node:
        if node.op_type == "Gather" and node.input[1] == "input_ids":
            node.input[1] = "ids_copy"
    model.graph.node.insert(0, helper.make_node("Identity", ["input_ids"], ["ids_copy"]))
    plan, _ = bench_point(model, "m.onnx")
    assert attention_sizes(model, plan) is None
    args, why = _ort_transformers_peer(model, plan, BenchSettings())
    assert args is None and "give --num-heads and --hidden-size" in why
    args, why = _ort_transformers_peer(model, plan, BenchSettings(num_heads=4, hidden_size=32))
    assert why is None and args == {"model_type": "gpt2", "num_heads": 4, "hidden_size": 32}


def test_an_encoder_keeps_the_bert_optimizer_and_no_point():
    from xflow.zoo import bert

    model = bert(small=True)
    plan, point = bench_point(model, "bert.onnx")
    assert point == {}
    args, why = _ort_transformers_peer(model, plan, BenchSettings())
    assert why is None and args["model_type"] == "bert"


def test_a_peer_that_drops_the_cache_is_flagged_at_the_decode_step(tmp_path, llama_path):
    """A peer whose present keys forget the past is equal to the original without a cache; at the decode step
    the bench checks at, it is not."""
    model = onnx.load(llama_path)
    broken = onnx.load(llama_path)
    (concat,) = [n for n in broken.graph.node if "present_key_0" in n.output]
    assert concat.op_type == "Concat" and concat.input[0] == "past_key_0"
    concat.input.remove("past_key_0")  # present = the new keys alone
    onnx.save(broken, tmp_path / "broken.onnx")
    plan, point = bench_point(model, llama_path)
    sessions = {ORIGINAL: open_session(llama_path), XFLOW: open_session(llama_path),
                "onnxslim": open_session(str(tmp_path / "broken.onnx"))}
    feeds = random_feeds(sessions[ORIGINAL], 0, plan.shapes_at(point))
    assert feeds["past_key_0"].shape[2] == 127 and feeds["attention_mask"].shape == (1, 128)
    assert list(output_drift(sessions, feeds)) == ["onnxslim"]
    prefill = random_feeds(sessions[ORIGINAL], 0, plan.shapes_at(plan.points()[1]))
    assert prefill["past_key_0"].shape[2] == 0
    assert output_drift(sessions, prefill) == {}  # without a cache the two agree: only the decode step shows it

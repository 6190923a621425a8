"""Generated candidates kept packed: the same rules, the same dedupe, the same candidate file, less memory."""

from __future__ import annotations

import json

import pytest
from xflow.generator.candidate_file import load_candidates, save_candidates
from xflow.generator.generalize import canonical_key, const_slots, dedupe
from xflow.generator.packed import PackedRules, pack, unpack
from xflow.generator.run import generate


@pytest.fixture(scope="module")
def one_op():
    return generate(max_ops=1, seed=0)


def test_packed_rules_read_back_as_the_dicts_they_were(one_op):
    rules = one_op.rules
    assert isinstance(rules, PackedRules) and len(rules) > 10
    dicts = list(rules)
    assert rules == dicts and rules[3] == dicts[3] and list(rules[2:5]) == dicts[2:5]
    assert rules[0] is not rules[0]  # each access unpacks a fresh dict: a caller's edits never reach the store
    assert rules != dicts[:-1] and rules != [{**dicts[0], "name": "other"}, *dicts[1:]]
    packed = pack(dicts[0], "k", frozenset())
    assert unpack(packed.blob) == dicts[0] and len(packed.blob) < len(json.dumps(dicts[0]))
    assert list(rules.texts()) == [json.dumps(d) for d in dicts]  # what the candidate file is written from


def test_dedupe_of_packed_rules_keeps_what_dedupe_of_dicts_keeps(one_op):
    dicts = list(one_op.rules)
    twice = dicts + [{**r, "name": r["name"] + "_copy"} for r in dicts[::3]]
    by_dict = dedupe(twice, key=lambda r: canonical_key(r["variants"][0]))
    packed = [pack(r, canonical_key(r["variants"][0]), const_slots(r)) for r in twice]
    by_packed = dedupe(packed, key=lambda p: p.key, slots=lambda p: p.consts, name=lambda p: p.name)
    assert [unpack(p.blob) for p in by_packed] == by_dict
    assert len(by_dict) == len(dicts)  # every copy is a duplicate of its rule


def test_the_candidate_file_is_what_json_dump_writes(one_op, tmp_path):
    path = tmp_path / "c.json"
    save_candidates(str(path), one_op.rules, 1, 0)
    whole = {"format": json.loads(path.read_text())["format"], "max_ops": 1, "seed": 0,
             "candidates": list(one_op.rules)}
    assert path.read_text() == json.dumps(whole)
    assert load_candidates(str(path), 1) == list(one_op.rules)
    save_candidates(str(path), [], 1, 0)
    assert json.loads(path.read_text())["candidates"] == []


def test_generate_only_writes_the_candidates_generate_gives_and_no_rule_file(one_op, tmp_path):
    from click.testing import CliRunner

    from xflow.cli import main

    saved, out = tmp_path / "c.json", tmp_path / "r.json"
    run = CliRunner().invoke(main, ["generate-rules", "--max-ops", "1", "--jobs", "1", "--generate-only",
                                    "--save-candidates", str(saved), "--out", str(out)])
    assert run.exit_code == 0, run.output
    assert load_candidates(str(saved), 1) == list(one_op.rules)
    assert f"wrote {saved}: {len(one_op.rules)} candidates" in run.output and not out.exists()
    assert "verifier" not in run.output  # the table stops at generation
    missing = CliRunner().invoke(main, ["generate-rules", "--max-ops", "1", "--generate-only"])
    assert missing.exit_code != 0 and "--save-candidates" in missing.output

"""``xflow rules stats`` and ``xflow rules merge``: look into rule files, join them."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import click

from xflow.cli.common import check_writable, user_errors
from xflow.cli.options import RULES_HELP, batching_option
from xflow.errors import XflowError


@click.group("rules")
def rules_group() -> None:
    """Inspect rule files."""


@rules_group.command("stats")
@click.argument("models", nargs=-1, required=True, metavar="MODEL...")
@click.option("--rules", "rules_path", type=click.Path(), default=None, help=RULES_HELP)
@click.option("--small", is_flag=True, help="Use the small variant of zoo models.")
@click.option("--top", type=int, default=15, show_default=True, help="Rules listed per model.")
@user_errors
def rules_stats(models: tuple[str, ...], rules_path: str | None, small: bool, top: int) -> None:
    """How many matches the rules find in each MODEL (an .onnx file or a zoo name) and which rules fire."""
    from xflow import zoo
    from xflow.onnx_io import graph_from_model, load
    from xflow.rewrite.match import find_matches
    from xflow.rules import default_rules_path, load_rules

    rules = load_rules(rules_path)
    click.echo(f"{rules_path or default_rules_path()}: {len(rules)} rules")
    for model in models:
        if os.path.exists(model):
            graph = load(model)
        elif model in zoo.MODELS:
            graph = graph_from_model(zoo.build(model, small=small))
        else:
            raise XflowError(model, f"no such file, and not a zoo model ({', '.join(sorted(zoo.MODELS))})")
        fired: Counter[str] = Counter()
        for rule in rules:
            n = sum(1 for _ in find_matches(graph, rule))
            if n:
                fired[rule.name] = n
        by_id = {r.name: r for r in rules}
        click.echo(f"{model}: {len(graph.nodes)} nodes, {sum(fired.values())} matches of {len(fired)} rules")
        for name, n in fired.most_common(top):
            rule = by_id[name]
            click.echo(f"  {n:>5}  {rule.readable_name:<32} {name}  {rule.doc[:80]}")


@rules_group.command("merge")
@click.argument("inputs", nargs=-1, required=True, metavar="RULES.json...")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True, help="Rule file to write.")
@batching_option
@click.option("--keep-compositions", is_flag=True,
              help="Also write rules that smaller rules of the result make in two steps (TASO's redundancy "
                   "pruning leaves them out by default, listed under left_out_compositions).")
@user_errors
def rules_merge(inputs: tuple[str, ...], out_path: str, keep_independent_batching: bool,
                keep_compositions: bool) -> None:
    """Join rule files into one: a rule found in several (same canonical text, whatever its name) is kept
    once, the most general; every rule keeps its provenance. As in generate-rules, a rule that smaller rules
    of the result compose is left out unless ``--keep-compositions``."""
    import json

    from xflow.generator.generalize import canonical_key, dedupe
    from xflow.generator.pipeline import split_batching
    from xflow.generator.redundancy import find_compositions
    from xflow.rules import load_rules, rules_from_json
    from xflow.rules.io import dump_rules

    check_writable(out_path)
    merged: list[dict[str, Any]] = []
    sources = []
    for path in inputs:
        rules = [r.to_json() for r in load_rules(path)]
        merged.extend(rules)
        with open(path, encoding="utf-8") as f:
            sources.append({"file": os.path.basename(path), "rules": len(rules),
                            "generated_by": json.load(f).get("generated_by", "")})
    kept, left_out = split_batching(dedupe(merged, key=canonical_key), keep_independent_batching)
    composed = {} if keep_compositions else find_compositions(kept).dropped
    meta: dict[str, Any] = {"merged_from": sources}
    if left_out:
        meta["left_out_independent_batching"] = [{"name": r["name"], "doc": r["doc"]} for r in left_out]
    if composed:
        meta["left_out_compositions"] = [{"name": r["name"], "doc": r["doc"], "composed_by": composed[r["name"]]}
                                         for r in kept if r["name"] in composed]
        kept = [r for r in kept if r["name"] not in composed]
    dump_rules(rules_from_json(kept), out_path, meta=meta)
    notes = [f"{len(left_out)} independent-batching rules"] if left_out else []
    notes += [f"{len(composed)} compositions of smaller rules"] if composed else []
    click.echo(f"wrote {out_path}: {len(kept)} rules from {len(merged)} in {len(inputs)} files"
               + (f" ({' and '.join(notes)} left out)" if notes else ""))


COMMANDS: list[click.Command] = [rules_group]

"""Rule commands: ``xflow generate-rules`` and ``xflow rules stats``."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from typing import Any

import click

from xflow.cli_common import check_writable, user_errors
from xflow.errors import XflowError


def _progress_line(enabled: bool):  # noqa: ANN202 - a small closure
    def show(text: str) -> None:
        if enabled:
            click.echo(f"\r{text:<78}", err=True, nl=False)

    return show


def proof_budget_options(func: Any) -> Any:
    """``--rlimit`` and ``--guard``: the z3 budget of a rule, shared by ``generate-rules`` and ``verify-rules``."""
    from verifier.prove import DEFAULT_GUARD_S, DEFAULT_RLIMIT

    func = click.option("--guard", "guard_s", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_GUARD_S,
                        show_default=True,
                        help="Last-resort wall-clock limit of one proof in seconds; a proof it stops is reported "
                             "as 'timeout' (a load-dependent answer), never as proved.")(func)
    return click.option("--rlimit", type=click.IntRange(min=1), default=DEFAULT_RLIMIT, show_default=True,
                        help="z3 resource units per rule (z3's own step count, so the answer is the same on any "
                             "machine at any load); a spent budget = unknown = not proved.")(func)


def executor_options(func: Any) -> Any:
    """``--executor`` and ``--address``: where generation and proof tasks run."""
    from xflow.executor import EXECUTORS

    func = click.option("--address", default=None,
                        help="Ray cluster to join (e.g. auto, or ray://HOST:10001); default: start a local "
                             "Ray instance of --jobs CPUs.")(func)
    return click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
                        help="local: --jobs processes on this machine; ray: Ray tasks (pip install "
                             "'xflow[ray]'), the same rule file for the same seed.")(func)


@click.command("generate-rules")
@click.option("--max-ops", type=click.IntRange(1, 4), default=3, show_default=True,
              help="Largest number of operators in an enumerated graph.")
@click.option("--jobs", type=click.IntRange(1, 256), default=os.cpu_count() or 1, show_default="all cores",
              help="Worker processes for enumeration and verification.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed: the same seed gives the same rule file.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="rules/default.json", show_default=True,
              help="Rule file to write.")
@proof_budget_options
@click.option("--trials", type=int, default=3, show_default=True, help="Random shape instantiations per rule.")
@click.option("--limit", type=int, default=None,
              help="Verify only the first N candidates in priority order (those matching a zoo model first, then "
                   "ops real models use); the rest are left out, and the table says how many.")
@click.option("--keep-independent-batching", is_flag=True,
              help="Also write rules that batch unconnected elementwise ops (relu(a) ; relu(b) -> "
                   "split(relu(concat(a, b)))); left out by default: they match every pair of such ops and "
                   "flood the search, and concat + split only add copies on a CPU.")
@click.option("--save-candidates", "save_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the generated (unverified) candidates here, so that a long run's verification can be "
                   "redone or extended with --candidates.")
@click.option("--candidates", "candidates_path", type=click.Path(dir_okay=False), default=None,
              help="Verify the candidates of this file (written by --save-candidates) instead of generating.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
@executor_options
@user_errors
def generate_rules(max_ops: int, jobs: int, seed: int, out_path: str, rlimit: int, guard_s: float, trials: int,
                   limit: int | None, keep_independent_batching: bool, save_path: str | None,
                   candidates_path: str | None, quiet: bool, executor: str, address: str | None) -> None:
    """Enumerate operator graphs, pair equal ones, prune, generalize, prove (z3) and check (numeric).

    Only proved rules are written. Prints the pruning and proof table at the end.
    """
    from xflow.executor import make_executor

    check_writable(out_path)
    engine = make_executor(executor, jobs, address)
    try:
        _generate_rules(max_ops, seed, out_path, rlimit, guard_s, trials, limit, keep_independent_batching,
                        save_path, candidates_path, quiet, engine)
    finally:
        engine.close()


def _generate_rules(max_ops: int, seed: int, out_path: str, rlimit: int, guard_s: float, trials: int,
                    limit: int | None, keep_independent_batching: bool, save_path: str | None,
                    candidates_path: str | None, quiet: bool, engine: Any) -> None:
    from generator.generalize import dedupe, final_name, priority
    from generator.lift import lift_candidates
    from generator.run import format_table, generate
    from generator.usefulness import match_counts, zoo_graphs
    from verifier.batch import WORKER_DIED, verify_candidates
    from xflow.rules import rules_from_json
    from xflow.rules.io import dump_rules

    check_writable(out_path)
    if save_path is not None:
        check_writable(save_path)
    started = time.perf_counter()
    show = _progress_line(not quiet and sys.stderr.isatty())
    if candidates_path is not None:
        candidates = _load_candidates(candidates_path, max_ops)
        table = [(f"candidates read from {os.path.basename(candidates_path)}", len(candidates), 0.0)]
    else:
        result = generate(max_ops, seed, engine.jobs,
                          progress=lambda name, count, secs: show(f"{name}: {count} ({secs:.1f} s)"), executor=engine)
        table = list(result.table)
        candidates = result.rules  # one per shape-generic key (``generate`` dedupes while it emits)
    if save_path is not None:
        _save_candidates(save_path, candidates, max_ops, seed)
    if limit is not None and limit < len(candidates):
        # what can fire on the zoo first (in a lifted form too), then the generator's own priority
        t = time.perf_counter()
        show("matching candidates against the zoo")
        fires = match_counts(candidates, zoo_graphs())
        table.append(("candidates matching a zoo model (verified first)", sum(n > 0 for n in fires),
                      round(time.perf_counter() - t, 3)))
        order = sorted(range(len(candidates)), key=lambda i: (fires[i] == 0, priority(candidates[i])))
        candidates = [candidates[i] for i in order[:limit]]
        table.append(("verified (--limit, priority order)", len(candidates), 0.0))
    counts: Counter[str] = Counter()

    def verify(batch: list[dict[str, Any]], label: str) -> list[Any]:
        t = time.perf_counter()
        counts.clear()

        def on_outcome(done: int, outcome: Any) -> None:
            counts[outcome.status] += 1
            show(f"verifying {label}{done}/{len(batch)}: {counts['proved']} proved")

        outcomes = verify_candidates(batch, rlimit=rlimit, trials=trials, seed=seed, progress=on_outcome,
                                     guard_s=guard_s, executor=engine)
        seconds = round(time.perf_counter() - t, 3)
        died = [o.name for o in outcomes if o.reason == WORKER_DIED]
        if died and not quiet:
            click.echo(f"\n{len(died)} candidate(s) killed their worker (memory limit or crash; not proved): "
                       + ", ".join(died[:20]), err=True)
        for status in ("proved", "refuted", "unknown", "timeout", "unsupported", "unchecked"):
            table.append((f"{label}verifier: {status}", counts.get(status, 0), seconds if status == "proved" else 0.0))
        return outcomes

    outcomes = verify(candidates, "")
    # Lifts of the proved conv rules to the forms models have (biased convs, conv + BatchNormalization),
    # each verified in turn: a lift of a rule that is not proved is seldom true, so only these are tried.
    t = time.perf_counter()
    lifted = lift_candidates([o.rule for o in outcomes if o.rule is not None])
    table.append(("lifts of proved rules (bias, batchnorm)", len(lifted), round(time.perf_counter() - t, 3)))
    outcomes += verify(lifted, "lifts: ")
    proved = dedupe([o.rule for o in outcomes if o.rule is not None])
    proved, left_out = _split_batching(proved, keep_independent_batching)
    table.append(("proved, left out: independent batching", len(left_out), 0.0))
    shipped = [{**r, "name": final_name(r, max_ops)} for r in proved]
    table.append(("rules shipped", len(shipped), 0.0))
    z3_total = sum(o.z3_seconds for o in outcomes)
    meta = {"generated_by": f"xflow generate-rules --max-ops {max_ops} --seed {seed} --rlimit {rlimit} "
                            f"--trials {trials}" + (f" --limit {limit}" if limit is not None else ""),
            "generator": {"max_ops": max_ops, "seed": seed},
            "verifier": {"rlimit": rlimit, "trials": trials,
                         "rlimit_used": sum(o.rlimit_used for o in outcomes)},
            # counts only: the times (printed below) would make two runs of the same seed differ
            "table": [[name, count] for name, count, _ in table]}
    if left_out:
        meta["left_out_independent_batching"] = [{"name": final_name(r, max_ops), "doc": r["doc"]} for r in left_out]
    dump_rules(rules_from_json(shipped), out_path, meta=meta)
    if not quiet:
        if sys.stderr.isatty():
            click.echo("", err=True)
        click.echo(format_table(table))
        click.echo(f"wrote {out_path}: {len(shipped)} proved rules in {time.perf_counter() - started:.1f} s "
                   f"(z3 {z3_total:.1f} s in all)")


def _save_candidates(path: str, candidates: list[dict[str, Any]], max_ops: int, seed: int) -> None:
    import json

    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"format": "xflow.candidates/1", "max_ops": max_ops, "seed": seed, "candidates": candidates}, f)
    os.replace(tmp, path)


def _load_candidates(path: str, max_ops: int) -> list[dict[str, Any]]:
    import json

    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise XflowError(path, f"cannot read candidates ({e})") from None
    if not isinstance(data, dict) or data.get("format") != "xflow.candidates/1":
        raise XflowError(path, "not a candidate file written by --save-candidates")
    if data.get("max_ops") != max_ops:
        raise XflowError(path, f"candidates of {data.get('max_ops')} ops; pass --max-ops {data.get('max_ops')}")
    return list(data["candidates"])


@click.group("rules")
def rules_group() -> None:
    """Inspect rule files."""


@rules_group.command("stats")
@click.argument("models", nargs=-1, required=True, metavar="MODEL...")
@click.option("--rules", "rules_path", type=click.Path(), default=None,
              help="Rule file (default: the shipped rules/default.json).")
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
@click.option("--keep-independent-batching", is_flag=True,
              help="Also write rules that batch unconnected elementwise ops (relu(a) ; relu(b) -> "
                   "split(relu(concat(a, b)))); left out by default: they match every pair of such ops and "
                   "flood the search, and concat + split only add copies on a CPU.")
@user_errors
def rules_merge(inputs: tuple[str, ...], out_path: str, keep_independent_batching: bool) -> None:
    """Join rule files into one: a rule found in several (same canonical text, whatever its name) is kept
    once, the most general; every rule keeps its provenance."""
    import json

    from generator.generalize import canonical_key, dedupe
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
    kept, left_out = _split_batching(dedupe(merged, key=canonical_key), keep_independent_batching)
    meta: dict[str, Any] = {"merged_from": sources}
    if left_out:
        meta["left_out_independent_batching"] = [{"name": r["name"], "doc": r["doc"]} for r in left_out]
    dump_rules(rules_from_json(kept), out_path, meta=meta)
    click.echo(f"wrote {out_path}: {len(kept)} rules from {len(merged)} in {len(inputs)} files"
               + (f" ({len(left_out)} independent-batching rules left out)" if left_out else ""))


def _split_batching(rules: list[dict[str, Any]], keep: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rules to write, independent-batching rules left out)."""
    from generator.usefulness import batches_independent_elementwise

    if keep:
        return rules, []
    batching = [batches_independent_elementwise(r) for r in rules]
    return ([r for r, b in zip(rules, batching, strict=True) if not b],
            [r for r, b in zip(rules, batching, strict=True) if b])


COMMANDS: list[click.Command] = [generate_rules, rules_group]

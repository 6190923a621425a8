"""Rule commands: ``xflow generate-rules`` and ``xflow rules stats``."""

from __future__ import annotations

import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import click

from xflow.cli_common import check_writable, user_errors
from xflow.errors import XflowError
from xflow.files import check_distinct


@dataclass
class ProgressLine:
    """``generate-rules``' progress on stderr. On a terminal, one line rewritten in place; elsewhere (a log file, CI)
    a line whenever the step changes and at most one every ``every_s`` seconds within a step, so that an hour-long
    run written to a log is not silent until its table."""

    tty: bool
    every_s: float = 60.0
    step: str | None = None  # the last line written, up to its first digit
    written_at: float = float("-inf")

    def __call__(self, text: str) -> None:
        if self.tty:
            click.echo(f"\r{text:<78}", err=True, nl=False)
            return
        step = re.split(r"\d", text, maxsplit=1)[0]
        now = time.monotonic()
        if step != self.step or now - self.written_at >= self.every_s:
            click.echo(text, err=True)
            self.step, self.written_at = step, now


def _no_progress(_text: str) -> None:
    return None


def _default_rlimit() -> int:
    from verifier.prove import DEFAULT_RLIMIT

    return DEFAULT_RLIMIT


def _generation_rlimit() -> int:
    from verifier.prove import GENERATION_RLIMIT

    return GENERATION_RLIMIT


def _default_guard() -> float:
    from verifier.prove import DEFAULT_GUARD_S

    return DEFAULT_GUARD_S


def proof_budget_options(func: Any, generation: bool = False) -> Any:
    """``--rlimit`` and ``--guard``: the z3 budget of a rule, shared by ``generate-rules`` and ``verify-rules``.
    The defaults are the verifier's, read when a command runs (importing z3 is not ``xflow``'s to pay);
    ``generation`` takes the smaller budget of candidates (``GENERATION_RLIMIT``)."""
    func = click.option("--guard", "guard_s", type=click.FloatRange(min=0, min_open=True), default=_default_guard,
                        show_default="1200",
                        help="Last-resort wall-clock limit of one proof in seconds; a proof it stops is reported "
                             "as 'timeout' (a load-dependent answer), never as proved.")(func)
    same = "(z3's own step count, so the answer is the same on any machine at any load)"
    if generation:
        default, shown = _generation_rlimit, "150000"
        help_ = (f"z3 resource units per candidate {same}; a spent budget = unknown = not written. Smaller than "
                 "verify-rules' default: a candidate the axioms cannot prove spends all of it.")
    else:
        default, shown = _default_rlimit, "10000000"
        help_ = f"z3 resource units per rule {same}; a spent budget = unknown = not proved."
    return click.option("--rlimit", type=click.IntRange(min=1), default=default, show_default=shown,
                        help=help_)(func)


def generation_budget_options(func: Any) -> Any:
    """``proof_budget_options`` with the candidates' budget (``generate-rules``)."""
    return proof_budget_options(func, generation=True)


def executor_options(func: Any) -> Any:
    """``--executor`` and ``--address``: where generation and proof tasks run."""
    from xflow.executor import EXECUTORS

    func = click.option("--address", default=None,
                        help="Ray cluster to join (e.g. auto, or ray://HOST:10001); default: start a local "
                             "Ray instance of --jobs CPUs.")(func)
    return click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
                        help="local: --jobs processes on this machine; ray: Ray tasks (pip install "
                             "'xflow[ray]'), the same rule file for the same seed.")(func)


#: the generator's enumeration reaches this many ops; a candidate file written by hand may hold larger patterns
MAX_ENUMERATED_OPS = 4
MAX_CANDIDATE_OPS = 16


@click.command("generate-rules")
@click.option("--max-ops", type=click.IntRange(1, MAX_CANDIDATE_OPS), default=3, show_default=True,
              help=f"Largest number of operators in an enumerated graph (1 to {MAX_ENUMERATED_OPS}). At "
                   f"{MAX_ENUMERATED_OPS}, only rules with a {MAX_ENUMERATED_OPS}-op side are written: merge the file "
                   "with a --max-ops 3 run's (xflow rules merge). With --candidates, the candidate file's size (up to "
                   f"{MAX_CANDIDATE_OPS}: written patterns, as benchmarks/fusion_candidates.py's attention).")
@click.option("--jobs", type=click.IntRange(1, 256), default=os.cpu_count() or 1, show_default="all cores",
              help="Worker processes for enumeration and verification.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed: the same seed gives the same rule file.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="rules/default.json", show_default=True,
              help="Rule file to write.")
@generation_budget_options
@click.option("--trials", type=int, default=3, show_default=True, help="Random shape instantiations per rule.")
@click.option("--limit", type=int, default=None,
              help="Verify only the first N candidates in priority order (those matching a zoo model first, then "
                   "ops real models use); the rest are left out, and the table says how many.")
@click.option("--keep-independent-batching", is_flag=True,
              help="Also write rules that batch unconnected elementwise ops (relu(a) ; relu(b) -> "
                   "split(relu(concat(a, b)))); left out by default: they match every pair of such ops and "
                   "flood the search, and concat + split only add copies on a CPU.")
@click.option("--keep-compositions", is_flag=True,
              help="Also write rules that are compositions of smaller proved rules (TASO's redundancy pruning "
                   "leaves them out: the smaller rules make the same rewrite in two or more steps).")
@click.option("--save-candidates", "save_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the generated (unverified) candidates here, so that a long run's verification can be "
                   "redone or extended with --candidates.")
@click.option("--candidates", "candidates_path", type=click.Path(dir_okay=False), default=None,
              help="Verify the candidates of this file (written by --save-candidates) instead of generating.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
@executor_options
@user_errors
def generate_rules(max_ops: int, jobs: int, seed: int, out_path: str, rlimit: int, guard_s: float, trials: int,
                   limit: int | None, keep_independent_batching: bool, keep_compositions: bool,
                   save_path: str | None, candidates_path: str | None, quiet: bool, executor: str,
                   address: str | None) -> None:
    """Enumerate operator graphs, pair equal ones, prune, generalize, prove (z3) and check (numeric).

    Only proved rules are written. Prints the pruning and proof table at the end.
    """
    from generator.rule_file import RuleFileOptions, write_rule_file
    from generator.run import format_table
    from verifier.batch import check_backend
    from xflow.executor import make_executor

    if candidates_path is None and max_ops > MAX_ENUMERATED_OPS:
        raise click.BadParameter(f"{max_ops}: graphs are enumerated up to {MAX_ENUMERATED_OPS} ops (larger sizes "
                                 "are for --candidates)", param_hint="--max-ops")
    check_distinct({"--candidates": candidates_path, "--out": out_path, "--save-candidates": save_path})
    check_writable(out_path)
    if save_path is not None:
        check_writable(save_path)
    options = RuleFileOptions(out_path, max_ops, jobs, seed, rlimit, guard_s, trials, limit,
                              keep_independent_batching, save_path, candidates_path, keep_compositions)
    engine = make_executor(executor, jobs, address)
    try:
        check_backend(engine)
        result = write_rule_file(options, _no_progress if quiet else ProgressLine(sys.stderr.isatty()), engine)
    finally:
        engine.close()
    if quiet:
        return
    if sys.stderr.isatty():
        click.echo("", err=True)
    if result.worker_deaths:
        click.echo(f"{len(result.worker_deaths)} candidate(s) killed their worker (memory limit or crash; not "
                   "proved): " + ", ".join(result.worker_deaths[:20]), err=True)
    click.echo(format_table(result.table))
    click.echo(f"wrote {out_path}: {result.shipped} proved rules in {result.seconds:.1f} s "
               f"(z3 {result.z3_seconds:.1f} s in all)")


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

    from generator.generalize import canonical_key, dedupe
    from generator.redundancy import find_compositions
    from generator.rule_file import split_batching
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


COMMANDS: list[click.Command] = [generate_rules, rules_group]

"""``xflow generate-rules``: enumerate, pair, prove and write a rule file (``generator.pipeline``)."""

from __future__ import annotations

import os
import sys

import click

from xflow.cli.common import check_writable, user_errors
from xflow.cli.options import batching_option, executor_options, generation_budget_options
from xflow.cli.progress import ProgressLine, no_progress
from xflow.files import check_distinct

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
@batching_option
@click.option("--keep-compositions", is_flag=True,
              help="Also write rules that are compositions of smaller proved rules (TASO's redundancy pruning "
                   "leaves them out: the smaller rules make the same rewrite in two or more steps).")
@click.option("--save-candidates", "save_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the generated (unverified) candidates here, so that a long run's verification can be "
                   "redone or extended with --candidates.")
@click.option("--candidates", "candidates_path", type=click.Path(dir_okay=False), default=None,
              help="Verify the candidates of this file (written by --save-candidates) instead of generating.")
@click.option("--generate-only", is_flag=True,
              help="Stop after generation: write the candidates to --save-candidates and print the table; nothing "
                   "is verified and no rule file is written.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
@executor_options
@user_errors
def generate_rules(max_ops: int, jobs: int, seed: int, out_path: str, rlimit: int, guard_s: float, trials: int,
                   limit: int | None, keep_independent_batching: bool, keep_compositions: bool,
                   save_path: str | None, candidates_path: str | None, generate_only: bool, quiet: bool,
                   executor: str, address: str | None) -> None:
    """Enumerate operator graphs, pair equal ones, prune, generalize, prove (z3) and check (numeric).

    Only proved rules are written. Prints the pruning and proof table at the end.
    """
    from xflow.generator.pipeline import RuleFileOptions, write_rule_file
    from xflow.generator.run import format_table
    from xflow.tasks import make_task_executor
    from xflow.verifier.batch import check_backend

    if candidates_path is None and max_ops > MAX_ENUMERATED_OPS:
        raise click.BadParameter(f"{max_ops}: graphs are enumerated up to {MAX_ENUMERATED_OPS} ops (larger sizes "
                                 "are for --candidates)", param_hint="--max-ops")
    if generate_only and (save_path is None or candidates_path is not None):
        raise click.BadParameter("needs --save-candidates FILE and no --candidates", param_hint="--generate-only")
    check_distinct({"--candidates": candidates_path, "--out": out_path, "--save-candidates": save_path})
    check_writable(out_path)
    if save_path is not None:
        check_writable(save_path)
    options = RuleFileOptions(out_path, max_ops, jobs, seed, rlimit, guard_s, trials, limit,
                              keep_independent_batching, save_path, candidates_path, keep_compositions, generate_only)
    engine = make_task_executor(executor, jobs, address)
    try:
        check_backend(engine)
        result = write_rule_file(options, no_progress if quiet else ProgressLine(sys.stderr.isatty()), engine)
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
    if generate_only:
        click.echo(f"wrote {save_path}: {result.candidates} candidates in {result.seconds:.1f} s")
        return
    click.echo(f"wrote {out_path}: {result.shipped} proved rules in {result.seconds:.1f} s "
               f"(z3 {result.z3_seconds:.1f} s in all)")


COMMANDS: list[click.Command] = [generate_rules]

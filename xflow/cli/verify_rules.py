"""``xflow verify-rules RULES.json``: re-prove and re-check a rule file (``verifier.batch``)."""

from __future__ import annotations

import os
import sys
import time

import click

from xflow.cli.common import check_writable, user_errors, write_json
from xflow.cli.options import executor_options, proof_budget_options
from xflow.files import check_distinct


@click.command("verify-rules")
@click.argument("rules_path", metavar="RULES.json", type=click.Path())
@proof_budget_options
@click.option("--trials", type=int, default=3, show_default=True, help="Random shape instantiations per rule.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the numeric check.")
@click.option("--jobs", type=click.IntRange(1, 256), default=os.cpu_count() or 1, show_default="all cores",
              help="Worker processes.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              help="Also write each rule's answer and z3 resource count here (JSON): the same on every run.")
@executor_options
@user_errors
def verify_rules(rules_path: str, rlimit: int, guard_s: float, trials: int, seed: int, jobs: int,
                 report_path: str | None, executor: str, address: str | None) -> None:
    """Re-prove (z3, from the operator axioms) and re-check numerically every rule of RULES.json.

    Prints one line per rule that fails, with its reason, and a summary; exits 1 if any rule fails.
    """
    from xflow.rules import load_rules
    from xflow.tasks import make_task_executor
    from xflow.verifier.batch import verify_candidates

    check_distinct({"RULES.json": rules_path, "--report": report_path})
    rules = load_rules(rules_path)
    if report_path is not None:
        check_writable(report_path)
    started = time.perf_counter()
    engine = make_task_executor(executor, jobs, address)
    try:
        outcomes = verify_candidates([r.to_json() for r in rules], rlimit=rlimit, trials=trials, seed=seed,
                                     guard_s=guard_s, executor=engine)
    finally:
        engine.close()
    jobs = engine.jobs
    failures = [o for o in outcomes if o.status != "proved"]
    for outcome in failures:
        click.echo(f"FAIL {outcome.name}: {outcome.status}: {outcome.reason}")
    seconds = time.perf_counter() - started
    if report_path is not None:
        write_json(report_path, {"rules": rules_path, "rlimit": rlimit, "trials": trials, "seed": seed,
                                 "answers": [{"name": o.name, "status": o.status, "rlimit_used": o.rlimit_used}
                                             for o in outcomes]})
    click.echo(f"{len(rules) - len(failures)} of {len(rules)} rules proved and checked in {seconds:.1f} s"
               f" ({len(failures)} failed, {sum(o.rlimit_used for o in outcomes)} z3 resource units, {jobs} "
               f"worker{'s' if jobs > 1 else ''})")
    if failures:
        sys.exit(1)


COMMANDS: list[click.Command] = [verify_rules]

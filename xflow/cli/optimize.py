"""``xflow optimize IN OUT``: the options of one optimization, handed to ``xflow.optimize.optimize_file``."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from xflow.cli.common import check_writable, require_onnxruntime, sigterm_as_interrupt, user_errors
from xflow.cli.logs import configure_logging
from xflow.cli.options import OPTIMIZE_DEFAULTS, RULES_HELP, THREADS_HELP, place_option
from xflow.cli.placing import place_request
from xflow.cli.progress import run_progress
from xflow.cli.summary import print_summary
from xflow.errors import XflowError

_D = OPTIMIZE_DEFAULTS


@click.command()
@click.argument("in_path", metavar="IN.onnx", type=click.Path(dir_okay=True))
@click.argument("out_path", metavar="OUT.onnx", type=click.Path())
@click.option("--rules", "rules_path", type=click.Path(), default=None, help=RULES_HELP)
@click.option("--trust-rules", is_flag=True,
              help="Use the --rules file's rules as they are, without proving first those that carry no proof (as "
              "xflow.optimize does): for rules you have checked yourself that z3 cannot settle.")
@click.option("--alpha", type=float, default=_D.search.alpha, show_default=True,
              help="Keep exploring graphs whose cost is below alpha x best cost (TASO's relaxation).")
@click.option("--budget", type=int, default=_D.search.budget, show_default=True, help="Most graphs the search expands.")
@click.option("--patience", type=click.IntRange(min=0), default=_D.search.patience or 0, show_default=True,
              help="Once a cheaper graph is found, stop the search after this many expansions in a row find no "
              "cheaper one (0: never).")
@click.option("--alternatives", "alternatives", type=click.IntRange(min=0), default=None, hidden=True,
              help="The former name of --branches.")
@click.option("--branches", type=click.IntRange(min=0), default=_D.search.branches, show_default=True,
              help="Also search on from up to this many other first sweeps (rules applied at every match of the "
              "input); their best graphs and the best one are timed end to end and the fastest is kept.")
@click.option("--time-limit", type=float, default=_D.search.time_limit, show_default=True,
              help="Search time limit in seconds.")
@click.option("--memory-limit", type=click.FloatRange(min=1), default=_D.search.memory_limit_mb, metavar="MB",
              help="Stop the search (keeping the best graph so far) once the process uses this much memory.")
@click.option("--cost", "cost_kind", type=click.Choice(["measured", "analytic"]), default=_D.cost.kind,
              show_default=True, help="Cost model for the search: node costs measured with ONNX Runtime "
              "(cached) or an analytic estimate.")
@click.option("--cost-db", type=click.Path(), default=_D.cost.db,  # a directory: refused in one line by the cache
              help="SQLite cache of measured costs (default: $XDG_CACHE_HOME/xflow/costs.sqlite).")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default=_D.runtime.provider, show_default=True,
              help="ONNX Runtime execution provider for cost measurement, verification and timing.")
@click.option("--threads", type=int, default=_D.runtime.threads, help=THREADS_HELP)
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=D1xD2...",
              help="Measure a dynamic input at this shape, e.g. --input-shape input=1x3x224x224 (the written "
                   "model keeps its dynamic dims). Repeatable.")
@click.option("--shape-profile", "shape_profile", multiple=True, metavar="NAME=V1,V2...",
              help="Sizes of a dynamic dim (an input's dim_param; x[0] for an unnamed one) at which costs are "
                   "measured and the A/B timed, e.g. --shape-profile batch=1,8 --shape-profile seq=128. Every "
                   "combination is timed. Default: 1 for a dim first in an input, else 128. Repeatable.")
@click.option("--inputs", "inputs_npz", type=click.Path(), default=_D.inputs.npz,
              help="An .npz of input arrays for the equivalence check and timing (default: seeded random).")
@click.option("--seed", type=int, default=_D.inputs.seed, show_default=True, help="Seed for random inputs.")
@click.option("--keep-if-slower", is_flag=True, help="Write the optimized model even if it did not measure faster.")
@click.option("--require-faster", is_flag=True,
              help="Write a rewrite only when it measures faster; by default one with fewer nodes or bytes is also "
                   "written when it is not slower (at most 2% slower, one-sided test at p < 0.05).")
@click.option("--report", "report_path", type=click.Path(), default=None,
              help="Write every figure of the run to this JSON file ('-': to stdout, and the summary to stderr).")
@click.option("--html", "html_path", type=click.Path(), default=None, metavar="FILE",
              help="Also write a page of the run to FILE: the verdict, the rewrites drawn before -> after, the "
                   "timings as charts, the operators before -> after, the certificate's summary (one HTML file, "
                   "nothing fetched when viewed).")
@click.option("-v", "--verbose", is_flag=True,
              help="Also print the developer's detail: the search, the cost cache, estimates, the finalists' timings, "
                   "the tests' statistics, and debug messages.")
@click.option("--no-certificate", "no_certificate", is_flag=True,
              help="Leave out the certificate a rewritten model carries (its derivation, which `xflow check` checks).")
@click.option("--certificate", "certificate_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the certificate alone to this JSON file.")
@click.option("--replay", "replay_path", type=click.Path(dir_okay=False), default=None,
              help="Apply the steps of this certificate (or of the model carrying one) without searching or "
                   "measuring: the OUT the run that made it wrote, byte for byte.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
@place_option
@user_errors
def optimize(in_path: str, out_path: str, rules_path: str | None, trust_rules: bool, alpha: float, budget: int,
             patience: int, alternatives: int | None, branches: int, time_limit: float, memory_limit: float | None,
             cost_kind: str, cost_db: str | None,
             provider: str, threads: int | None, input_shapes: tuple[str, ...], shape_profile: tuple[str, ...],
             inputs_npz: str | None, seed: int, keep_if_slower: bool, require_faster: bool, report_path: str | None,
             html_path: str | None, no_certificate: bool, certificate_path: str | None, replay_path: str | None,
             verbose: bool, quiet: bool,
             place_topology: str | None, place_time_limit: float) -> None:
    """Optimize IN.onnx and write OUT.onnx.

    The result is checked against the original on the same inputs with ONNX Runtime and timed against
    it (interleaved runs on up to 10-12 pairs of fresh sessions, fewer when the answer is clear). It is written
    when it is faster over the pairs (a sequential one-sided signed-rank test, p < 0.01 overall), or when it has
    fewer nodes or bytes and is not slower (at most 2% slower by the same test at p < 0.05; not with
    --require-faster); otherwise the original is written and the run says so.
    """
    require_onnxruntime()
    from xflow.files import check_output_file
    from xflow.onnx_io import parse_input_shapes
    from xflow.onnx_io.shape_profile import parse_shape_profile
    from xflow.optimize import OptimizeOptions, optimize_file
    from xflow.optimize.run import replay_file

    options = OptimizeOptions.of(
        rules_path=rules_path, rules=_proved_rules(rules_path, cost_db, quiet, trust_rules), alpha=alpha,
        budget=budget, patience=patience or None,
        branches=branches if alternatives is None else alternatives, time_limit=time_limit, memory_limit=memory_limit,
        provider=provider,
        threads=threads, cost=cost_kind, cost_db=cost_db, input_shapes=parse_input_shapes(input_shapes),
        shape_profile=parse_shape_profile(shape_profile), inputs_npz=inputs_npz, seed=seed,
        keep_if_slower=keep_if_slower, require_faster=require_faster, certificate=not no_certificate,
        certificate_path=certificate_path, replay=replay_path)
    progress = run_progress(quiet)  # on a terminal only
    # the library's messages (its logger) on stderr, the progress line erased while one is written
    configure_logging(verbose, quiet, progress.paused if progress is not None else None)
    if certificate_path is not None:
        check_output_file(certificate_path, "certificate")
        check_writable(certificate_path)
    if html_path is not None:
        if replay_path is not None:
            raise XflowError(html_path, "--html draws a run's search and timings, which --replay makes none of")
        check_output_file(html_path, "page")
        check_writable(html_path)
    if replay_path is not None:
        replayed = replay_file(in_path, out_path, options)
        if not quiet:
            click.echo(f"replayed {replayed.steps} steps ({len(replayed.rules)} rules) of {replay_path}: "
                       f"wrote {out_path}")
        return
    to_stdout = report_path == "-"
    if report_path and not to_stdout:
        check_output_file(report_path, "report")
        check_writable(report_path)
        if os.path.realpath(report_path) in {os.path.realpath(in_path), os.path.realpath(out_path)}:
            raise XflowError(report_path, "--report names the input or output model; choose another path")
    placing = place_request(place_topology, place_time_limit, out_path, quiet)
    try:
        with sigterm_as_interrupt():  # a pipeline's timeout or kill: clean up as for Ctrl-C
            report = optimize_file(in_path, out_path, options, progress=progress, place_request=placing,
                                   report_path=None if to_stdout else report_path, page=_page(html_path))
    finally:
        if progress is not None:
            progress.close()  # the line erased before the summary or an error is printed
    if not quiet:
        print_summary(report, verbose=verbose, err=to_stdout)  # stdout is the report's when it goes there
    if to_stdout:
        click.echo(json.dumps(report.to_json(), indent=2))


def _page(path: str | None) -> Any:
    """The ``--html`` page's request (None: none asked for)."""
    if path is None:
        return None
    from xflow.cli.html import render
    from xflow.optimize.run import PageRequest

    return PageRequest(path, render)


def _proved_rules(rules_path: str | None, cost_db: str | None, quiet: bool, trust: bool) -> list[Any] | None:
    """The rules of ``--rules``, each that carries no proof proved first (``verifier.user_rules``: a numeric
    counterexample, then z3 within a small budget) or refused by name; None for the shipped rules (all proved)
    and with ``--trust-rules`` (the library then reads the file as it is)."""
    if rules_path is None or trust:
        return None
    from xflow.files import check_distinct
    from xflow.rules import load_rules
    from xflow.verifier.user_rules import prove_unproved

    check_distinct({"--rules": rules_path, "--cost-db": cost_db})  # before the rule file is read
    rules, proved = prove_unproved(load_rules(rules_path), rules_path)
    if proved and not quiet:
        click.echo(f"{rules_path}: proved {proved} rule{'s' if proved > 1 else ''} that carried no proof")
    return rules


COMMANDS: list[click.Command] = [optimize]

"""The ``xflow`` command line."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import click

from xflow.cli_common import check_writable, save_model, user_errors, write_json
from xflow.cli_place import place_option, place_request
from xflow.cli_rules import executor_options, proof_budget_options
from xflow.errors import XflowError
from xflow.files import check_distinct


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="xflow")
def main() -> None:
    """xflow: a graph-substitution superoptimizer for ONNX models.

    Rewrites a model with substitution rules that were generated and proved (z3) beforehand,
    chooses rewrites by costs measured with ONNX Runtime, and writes the result only after checking
    that it computes the same outputs and runs faster.
    """


@main.command()
@click.argument("in_path", metavar="IN.onnx", type=click.Path(dir_okay=True))
@click.argument("out_path", metavar="OUT.onnx", type=click.Path())
@click.option("--rules", "rules_path", type=click.Path(), default=None,
              help="Rule file (default: the shipped rules/default.json).")
@click.option("--trust-rules", is_flag=True,
              help="Use the --rules file's rules as they are, without proving first those that carry no proof (as "
              "xflow.optimize does): for rules you have checked yourself that z3 cannot settle.")
@click.option("--alpha", type=float, default=1.05, show_default=True,
              help="Keep exploring graphs whose cost is below alpha x best cost (TASO's relaxation).")
@click.option("--budget", type=int, default=300, show_default=True, help="Most graphs the search expands.")
@click.option("--patience", type=click.IntRange(min=0), default=10, show_default=True,
              help="Once a cheaper graph is found, stop the search after this many expansions in a row find no "
              "cheaper one (0: never).")
@click.option("--alternatives", type=click.IntRange(min=0), default=2, show_default=True,
              help="Also search on from up to this many other first sweeps (rules applied at every match of the "
              "input); their best graphs and the best one are timed end to end and the fastest is kept.")
@click.option("--time-limit", type=float, default=60.0, show_default=True, help="Search time limit in seconds.")
@click.option("--memory-limit", type=click.FloatRange(min=1), default=None, metavar="MB",
              help="Stop the search (keeping the best graph so far) once the process uses this much memory.")
@click.option("--cost", "cost_kind", type=click.Choice(["measured", "analytic"]), default="measured",
              show_default=True, help="Cost model for the search: node costs measured with ONNX Runtime "
              "(cached) or an analytic estimate.")
@click.option("--cost-db", type=click.Path(), default=None,  # a directory is refused in one line by the cache
              help="SQLite cache of measured costs (default: $XDG_CACHE_HOME/xflow/costs.sqlite).")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="ONNX Runtime execution provider for cost measurement, verification and timing.")
@click.option("--threads", type=int, default=None, help="ORT intra-op threads (default: all cores).")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=D1xD2...",
              help="Measure a dynamic input at this shape, e.g. --input-shape input=1x3x224x224 (the written "
                   "model keeps its dynamic dims). Repeatable.")
@click.option("--shape-profile", "shape_profile", multiple=True, metavar="NAME=V1,V2...",
              help="Sizes of a dynamic dim (an input's dim_param; x[0] for an unnamed one) at which costs are "
                   "measured and the A/B timed, e.g. --shape-profile batch=1,8 --shape-profile seq=128. Every "
                   "combination is timed. Default: 1 for a dim first in an input, else 128. Repeatable.")
@click.option("--inputs", "inputs_npz", type=click.Path(), default=None,
              help="An .npz of input arrays for the equivalence check and timing (default: seeded random).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for random inputs.")
@click.option("--keep-if-slower", is_flag=True, help="Write the optimized model even if it did not measure faster.")
@click.option("--report", "report_path", type=click.Path(), default=None,
              help="Write every figure of the run to this JSON file.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
@place_option
@user_errors
def optimize(in_path: str, out_path: str, rules_path: str | None, trust_rules: bool, alpha: float, budget: int,
             patience: int,
             alternatives: int,
             time_limit: float, memory_limit: float | None, cost_kind: str, cost_db: str | None, provider: str,
             threads: int | None, input_shapes: tuple[str, ...], shape_profile: tuple[str, ...],
             inputs_npz: str | None, seed: int, keep_if_slower: bool, report_path: str | None, quiet: bool,
             place_topology: str | None, place_time_limit: float) -> None:
    """Optimize IN.onnx and write OUT.onnx.

    The result is checked against the original on the same inputs with ONNX Runtime and timed against
    it (interleaved runs on 10-12 pairs of fresh sessions); unless it is faster over the pairs (one-sided
    signed-rank test, p < 0.01), the original is written and the run says so.
    """
    from xflow.files import check_output_file
    from xflow.onnx_io import parse_input_shapes
    from xflow.onnx_io.profile import parse_shape_profile
    from xflow.pipeline import OptimizeOptions, optimize_file

    options = OptimizeOptions(rules_path=rules_path, rules=_proved_rules(rules_path, cost_db, quiet, trust_rules),
                              alpha=alpha,
                              budget=budget, patience=patience or None,
                              alternatives=alternatives,
                              time_limit=time_limit, memory_limit=memory_limit, provider=provider,
                              threads=threads, cost=cost_kind, cost_db=cost_db,
                              input_shapes=parse_input_shapes(input_shapes),
                              shape_profile=parse_shape_profile(shape_profile),
                              inputs_npz=inputs_npz, seed=seed, keep_if_slower=keep_if_slower)
    say = (lambda _m: None) if quiet else click.echo
    progress = _search_progress() if (not quiet and sys.stderr.isatty()) else None
    if report_path:
        check_output_file(report_path, "report")
        check_writable(report_path)
        if os.path.realpath(report_path) in {os.path.realpath(in_path), os.path.realpath(out_path)}:
            raise XflowError(report_path, "--report names the input or output model; choose another path")
    placing = place_request(place_topology, place_time_limit, out_path, quiet)
    with _sigterm_as_interrupt():  # a pipeline's timeout or kill: clean up as for Ctrl-C
        report = optimize_file(in_path, out_path, options, say=say, progress=progress, place_request=placing,
                               report_path=report_path)
    if progress is not None:
        click.echo("", err=True)
    if not quiet:
        _print_summary(report)


def _proved_rules(rules_path: str | None, cost_db: str | None, quiet: bool, trust: bool) -> list[Any] | None:
    """The rules of ``--rules``, each that carries no proof proved first (``verifier.user_rules``: a numeric
    counterexample, then z3 within a small budget) or refused by name; None for the shipped rules (all proved)
    and with ``--trust-rules`` (the library then reads the file as it is)."""
    if rules_path is None or trust:
        return None
    from verifier.user_rules import prove_unproved
    from xflow.files import check_distinct
    from xflow.rules import load_rules

    check_distinct({"--rules": rules_path, "--cost-db": cost_db})  # before the rule file is read
    rules, proved = prove_unproved(load_rules(rules_path), rules_path)
    if proved and not quiet:
        click.echo(f"{rules_path}: proved {proved} rule{'s' if proved > 1 else ''} that carried no proof")
    return rules


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM unwinds like Ctrl-C: temp files and scratch copies are removed and nothing
    is written (Python's default would stop at once and leave them). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _search_progress() -> Callable[[Any], None]:
    def show(result: Any) -> None:
        click.echo(f"\rsearch: {result.explored} expanded, {result.generated} generated, "
                   f"best cost {result.best_cost * 1e3:.3f} ms ({result.seconds:.1f} s)", err=True, nl=False)

    return show


def _print_summary(report: Any) -> None:
    ir = (f"; IR {report.ir_nodes_before} -> {report.ir_nodes_after}"
          if (report.ir_nodes_before, report.ir_nodes_after) != (report.nodes_before, report.nodes_after) else "")
    click.echo(f"{report.input}: {report.nodes_before} nodes -> {report.nodes_after} nodes{ir} "
               f"({report.rules_loaded} rules, search {report.search_seconds:.2f} s, stop: {report.search_stop})")
    click.echo(f"  {report.nodes_before - report.nodes_opaque} of {report.nodes_before} nodes in the algebra "
               f"({report.nodes_opaque} opaque: carried through, never rewritten)")
    if report.rules_applied:
        from xflow.rules.naming import by_readable_name

        named = by_readable_name(report.rules_applied, report.rule_names)
        applied = ", ".join(f"{name} x{count}" for name, count in sorted(named.items()))
        click.echo(f"  rewrites: {applied}")
        if report.finalists:
            timed = " / ".join("-" if f["measured_ms"] is None else f"{f['measured_ms']:.3f}" for f in report.finalists)
            estimated = " / ".join(f"{f['estimated_ms']:.3f}" for f in report.finalists)
            chosen = next(i for i, f in enumerate(report.finalists) if f["chosen"]) + 1
            completed = sum(1 for f in report.finalists if f.get("completed"))
            which = f" ({completed} of them completions of another's rules)" if completed else ""
            click.echo(f"  {len(report.finalists)} graphs timed end to end{which}: {timed} ms "
                       f"(estimated {estimated} ms); kept #{chosen}")
        if report.splits_folded or report.elementwise_hoisted or report.channelwise_hoisted:
            click.echo(f"  then: {report.splits_folded} nested splits folded into one, "
                       f"{report.elementwise_hoisted} elementwise ops and {report.channelwise_hoisted} batchnorms "
                       "applied once before a split"
                       + (f" ({report.splits_regridded} split trees cut the other way first, "
                          f"{report.weights_permuted} matmuls given their weight's columns permuted to line pieces up)"
                          if report.splits_regridded or report.weights_permuted else ""))
        click.echo(f"  estimated cost ({report.cost_model}): {report.cost_before * 1e3:.3f} ms -> "
                   f"{report.cost_after * 1e3:.3f} ms")
    if report.cost_db is not None:
        click.echo(f"  cost cache: {report.cost_db_hits} hits, {report.nodes_measured} node configurations measured "
                   f"in {report.measure_sessions} sessions ({report.measure_seconds:.2f} s)"
                   + (f"; later sessions' kernels took {report.session_scale[0]:.2f}-{report.session_scale[1]:.2f}x "
                      "the first's time and were scaled to it" if report.session_scale else ""))
    if report.verified:
        worst = max(report.max_abs_diff.values(), default=0.0)
        click.echo(f"  outputs match the original (max abs diff {worst:.2e}; compared with {report.verify_reference} "
                   f"on {', '.join(report.verify_inputs)})")
    if report.latency_before_ms is not None and not report.steps:
        click.echo(f"  measured latency: {report.latency_before_ms:.3f} ms (model unchanged)")
    elif report.latency_before_ms is not None:
        click.echo(f"  measured latency: {report.latency_before_ms:.3f} ms -> {report.latency_after_ms:.3f} ms "
                   f"({report.speedup:.3f}x, the median of {report.session_pairs} session pairs, "
                   f"{report.timed_runs} interleaved runs; faster in {report.faster_pairs} of the pairs, "
                   f"signed-rank p = {report.rank_test_p:.2g})")
    _print_dynamic(report)
    if report.values_with_denormals:
        click.echo(f"  {len(report.values_with_denormals)} values hold float denormals on these inputs, which "
                   "many x86 CPUs multiply slowly and others do not (a rule lifts them before a matmul where timing "
                   "shows it pays); `xflow denormals` measures what ONNX Runtime's flush of them gains on this one")
    click.echo(f"  wrote {report.output}: {report.decision}")


def _print_dynamic(report: Any) -> None:
    """The other sizes a dynamic model was checked and timed at."""
    if report.checked_at:
        click.echo(f"  outputs match at other sizes too: {'; '.join(report.checked_at)}")
    for entry in report.profile_points[1:]:
        point = " ".join(f"{k}={v}" for k, v in entry["point"].items())
        click.echo(f"  at {point}: {entry['latency_before_ms']:.3f} ms -> {entry['latency_after_ms']:.3f} ms"
                   f"{'' if entry['faster'] else ' (not faster)'}")


@main.command("verify-rules")
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
    import time

    from verifier.batch import verify_candidates
    from xflow.executor import make_executor
    from xflow.rules import load_rules

    check_distinct({"RULES.json": rules_path, "--report": report_path})
    rules = load_rules(rules_path)
    if report_path is not None:
        check_writable(report_path)
    started = time.perf_counter()
    engine = make_executor(executor, jobs, address)
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


@main.command()
@click.argument("name")
@click.argument("out_path", metavar="OUT.onnx", type=click.Path())
@click.option("--small", is_flag=True, help="A reduced variant (fewer layers/channels) for quick runs.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the random weights.")
@click.option("--dynamic", is_flag=True, help="The dynamic-batch twin: dim_param 'batch' on inputs and outputs.")
@user_errors
def zoo(name: str, out_path: str, small: bool, seed: int, dynamic: bool) -> None:
    """Write benchmark model NAME from the built-in zoo to OUT.onnx.

    Models: resnet50, resnext50, inception_v3, squeezenet, bert, nasnet_a, nasrnn.
    """
    from xflow import zoo as zoo_models

    if name not in zoo_models.MODELS:
        raise XflowError(None, f"unknown zoo model {name!r}; choose one of {', '.join(sorted(zoo_models.MODELS))}")
    check_writable(out_path)
    model = zoo_models.build(name, small=small, seed=seed, dynamic=dynamic)
    save_model(model, out_path)
    kind = " ".join(k for k, on in (("small", small), ("dynamic batch", dynamic)) if on)
    click.echo(f"wrote {out_path}: {name}{f' ({kind})' if kind else ''}, {len(model.graph.node)} nodes")


def _add_command_modules() -> None:
    """Commands of the later stages live in their own modules, one per area."""
    from xflow import cli_bench, cli_denormals, cli_place, cli_rules

    for module in (cli_rules, cli_bench, cli_place, cli_denormals):
        for command in module.COMMANDS:
            main.add_command(command)


_add_command_modules()

if __name__ == "__main__":
    main()

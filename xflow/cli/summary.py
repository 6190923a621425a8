"""``xflow optimize``'s summary: the report's figures as a few lines of text."""

from __future__ import annotations

from typing import Any

import click


def print_summary(report: Any) -> None:
    """Nodes before and after, rewrites, finalists, costs, the cost cache, the check, the A/B and the decision."""
    ir = (f"; IR {report.ir_nodes_before} -> {report.ir_nodes_after}"
          if (report.ir_nodes_before, report.ir_nodes_after) != (report.nodes_before, report.nodes_after) else "")
    click.echo(f"{report.input}: {report.nodes_before} nodes -> {report.nodes_after} nodes{ir} "
               f"({report.rules_loaded} rules, search {report.search_seconds:.2f} s, stop: {report.search_stop})")
    click.echo(f"  {report.nodes_before - report.nodes_opaque} of {report.nodes_before} nodes in the algebra "
               f"({report.nodes_opaque} opaque: carried through, never rewritten)")
    if report.rules_applied:
        _print_rewrites(report)
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


def _print_rewrites(report: Any) -> None:
    """The rules applied, the finalists timed end to end, the post-passes and the estimated costs."""
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


def _print_dynamic(report: Any) -> None:
    """The other sizes a dynamic model was checked and timed at."""
    if report.checked_at:
        click.echo(f"  outputs match at other sizes too: {'; '.join(report.checked_at)}")
    for entry in report.profile_points[1:]:
        point = " ".join(f"{k}={v}" for k, v in entry["point"].items())
        click.echo(f"  at {point}: {entry['latency_before_ms']:.3f} ms -> {entry['latency_after_ms']:.3f} ms"
                   f"{'' if entry['faster'] else ' (not faster)'}")

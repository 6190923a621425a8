"""``xflow optimize``'s summary, in the shape of its peers' (onnxslim, onnxsim): a table of the ONNX operators
before -> after with the nodes and the model's size, the measured latency with its ratio, the rewrites by name, and
the verdict last, in plain words. What a developer reads (the search, the cost cache, estimates, finalists'
timings, the test statistics) is printed only with ``verbose``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from xflow.optimize.decision import Decision
from xflow.optimize.select import SELECT_TIE
from xflow.runtime import NON_INFERIORITY_MARGIN


def print_summary(report: Any, verbose: bool = False, err: bool = False) -> None:
    """The summary of ``report`` (an ``OptimizeReport``) on stdout (``err``: on stderr)."""
    def echo(line: str = "") -> None:
        click.echo(line, err=err)

    echo(f"{report.input} -> {report.output}")
    for line in operator_table(report):
        echo(f"  {line}")
    if report.latency_before_ms is not None:
        echo(f"  {latency_line(report)}")
    for entry in report.profile_points[1:]:
        point = _point_words(entry["point"])
        echo(f"  at {point}: {entry['latency_before_ms']:.3f} ms -> {entry['latency_after_ms']:.3f} ms "
             f"({_point_verdict(entry, report.not_slower_p is not None)})")
    if getattr(report, "decisions_from_cache", None):
        echo(f"  {timings_remembered(report.decisions_from_cache)}")
    if report.rules_applied:
        echo(f"  rewrites: {rewrites_line(report)}")
    if shape_changes(report):
        echo(f"  shape arithmetic: {report.shapes_folded} values folded, {report.shapes_shared} read through an equal "
             f"one, {report.shapes_deleted} nodes deleted")
    if report.constants_evaluated:
        echo(f"  constant subgraphs: {report.constants_evaluated} values computed once (ONNX Runtime), "
             f"{report.constant_nodes_deleted} nodes deleted")
    if report.values_shared:
        echo(f"  repeated values: {report.values_shared} read through an equal one, "
             f"{report.shared_nodes_deleted} nodes deleted")
    if report.verified:
        worst = max(report.max_abs_diff.values(), default=0.0)
        echo(f"  outputs match the original (max abs diff {worst:.2e}; compared with {report.verify_reference} "
             f"on {', '.join(report.verify_inputs)})")
    if report.checked_at:
        echo(f"  outputs match at other sizes too: {'; '.join(report.checked_at)}")
    if report.values_with_denormals:
        echo(f"  {len(report.values_with_denormals)} values hold float denormals on these inputs, which many x86 "
             "CPUs multiply slowly and others do not (a rule lifts them before a matmul where timing shows it "
             "pays); `xflow denormals` measures what ONNX Runtime's flush of them gains on this one")
    if verbose:
        _print_details(report, echo)
    echo(f"wrote {report.output}: {verdict(report)}")


def operator_table(report: Any) -> list[str]:
    """Rows: each ONNX op type with its count before and after ("-": none), then the nodes and the model size."""
    ops = sorted(set(report.ops_before) | set(report.ops_after))
    rows = [(op, _count(report.ops_before.get(op)), _count(report.ops_after.get(op))) for op in ops]
    rows.append(("nodes", str(report.nodes_before), str(report.nodes_after)))
    if report.bytes_before:
        rows.append(("model size", readable_bytes(report.bytes_before), readable_bytes(report.bytes_after)))
    width = max(len(name) for name, _, _ in rows)
    columns = [max(len("before"), *(len(b) for _, b, _ in rows)), max(len("after"), *(len(a) for _, _, a in rows))]
    lines = [f"{'op':<{width}}  {'before':>{columns[0]}}  {'after':>{columns[1]}}"]
    lines += [f"{name:<{width}}  {before:>{columns[0]}}  {after:>{columns[1]}}"
              + ("" if before == after or name in ("nodes", "model size") else "  *") for name, before, after in rows]
    return lines


def _count(n: int | None) -> str:
    return str(n) if n else "-"


def readable_bytes(n: int) -> str:
    """A size in B, KB, MB or GB (powers of 1000, as the peers print them)."""
    if n < 1000:
        return f"{n} B"
    for unit, scale in (("KB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if n < scale * 1000 or unit == "GB":
            return f"{n / scale:.2f} {unit}"
    raise AssertionError("unreachable")


def latency_line(report: Any) -> str:
    """The measured latency, before -> after with the ratio (the original's alone when nothing was rewritten)."""
    if not report.steps and not shape_changes(report):
        return f"measured latency: {report.latency_before_ms:.3f} ms (model unchanged)"
    # each side's median over the pairs, and the ratio the A/B tests and the verdict quotes: the median pair's
    # (the two medians come from different pairs, so their own ratio can point the other way)
    if report.session_pairs > 1:
        return (f"measured latency: {report.latency_before_ms:.3f} ms -> {report.latency_after_ms:.3f} ms "
                f"(medians of {report.session_pairs} session pairs; the median pair: {ratio_words(report.speedup)})")
    return (f"measured latency: {report.latency_before_ms:.3f} ms -> {report.latency_after_ms:.3f} ms "
            f"({ratio_words(report.speedup)})")


def timings_remembered(kinds: list[str]) -> str:
    """What the run read from the cost cache instead of timing it again."""
    what = {"select": "the finalists' end-to-end timing", "ab": "the A/B against the original"}
    named = ", ".join(dict.fromkeys(what.get(k, k) for k in kinds))
    return (f"timings read from the cost cache, as an earlier run measured them: {named} (the same cache and seed "
            "write the same model; another --cost-db times them afresh)")


def shape_changes(report: Any) -> int:
    """How many values and nodes of the shape arithmetic the written graph folded, shared or deleted."""
    return report.shapes_folded + report.shapes_shared + report.shapes_deleted


def ratio_words(speedup: float) -> str:
    """"1.50x faster", "1.02x slower", "as fast (1.00x)"."""
    if round(speedup, 2) == 1.0:
        return "as fast (1.00x)"
    return f"{speedup:.2f}x faster" if speedup > 1 else f"{1 / speedup:.2f}x slower"


def rewrites_line(report: Any) -> str:
    """The rules applied by readable name, each with how often."""
    from xflow.rules.naming import by_readable_name

    named = by_readable_name(report.rules_applied, report.rule_names)
    return ", ".join(f"{name} x{count}" for name, count in sorted(named.items()))


def verdict(report: Any) -> str:
    """What was written and why, in plain words."""
    decision = Decision(report.outcome)
    checked = "; outputs match the original" if report.verified else ""
    measured = report.latency_before_ms is not None and (report.steps or shape_changes(report))
    nodes = f"{report.nodes_before} nodes -> {report.nodes_after} nodes"
    others = report.profile_points[1:]
    if decision is Decision.SIMPLER_NOT_SLOWER:
        first_faster = bool(report.profile_points) and report.profile_points[0].get("verdict") == "faster"
        if first_faster:  # faster at the first point, within the margin at another
            within = "; ".join(_point_words(e["point"]) for e in others if e.get("verdict") == "not-slower")
            return (f"the optimized model, simpler, not slower: {nodes}, {ratio_words(report.speedup)} at the first "
                    f"profile point and within {NON_INFERIORITY_MARGIN:.0%} of the original's time at {within}"
                    f"{checked}")
        return (f"the optimized model, simpler, not slower: {nodes}, {ratio_words(report.speedup)} (within "
                f"{NON_INFERIORITY_MARGIN:.0%} of the original's time){checked}")
    if decision is Decision.OPTIMIZED:
        if not measured:
            return f"the optimized model, {nodes} (not timed){checked}"
        faster = report.rank_test_p is not None and report.rank_test_p < 0.01 and report.speedup > 1
        how = ratio_words(report.speedup) if faster else \
            f"not measurably faster ({ratio_words(report.speedup)}), written as --keep-if-slower asks"
        return f"the optimized model, {nodes}, {how}{checked}"
    within = f" nor within {NON_INFERIORITY_MARGIN:.0%} of its time" if report.not_slower_p is not None else ""
    if decision is Decision.NOT_FASTER_AT_EVERY_POINT and measured and others:
        slower = "; ".join(_point_words(e["point"]) for e in others if e.get("verdict") == "slower")
        short = f"neither faster{within}" if within else "not faster"
        return (f"the original, {report.decision}: the rewrites measured {ratio_words(report.speedup)} at the first "
                f"profile point over {report.session_pairs} session pairs, but {short} at {slower}")
    if decision in (Decision.NOT_FASTER, Decision.NOT_FASTER_AT_EVERY_POINT) and measured:
        # the median pair can read "as fast" while the pairs' spread leaves "within 2%" unshown: say which test failed
        shown = f"neither measurably faster nor shown to be within {NON_INFERIORITY_MARGIN:.0%} of its time" \
            if within else "not measurably faster"
        return (f"the original, {report.decision}: the rewrites measured {ratio_words(report.speedup)} over "
                f"{report.session_pairs} session pairs: {shown}")
    return f"the original, {report.decision}"


def _point_verdict(entry: dict[str, Any], margin_tested: bool) -> str:
    """What the A/B found at one profile point, in words: "faster", "within 2%", or "not faster" (and not within the
    margin, where a simpler model was tested for it)."""
    verdict = entry.get("verdict", "faster" if entry.get("faster") else "slower")
    if verdict == "faster":
        return "faster"
    if verdict == "not-slower":
        return f"within {NON_INFERIORITY_MARGIN:.0%}"
    return f"neither faster nor within {NON_INFERIORITY_MARGIN:.0%}" if margin_tested else "not faster"


def _point_words(point: dict[str, int]) -> str:
    """A profile point as the summary names it: ``batch=1 seq=128``."""
    return " ".join(f"{k}={v}" for k, v in point.items())


def _print_details(report: Any, echo: Callable[[str], None]) -> None:
    """``-v``: the search, the algebra's share, the finalists, the post-passes, the estimates, the cost cache, the
    check and the A/B's statistics."""
    echo(f"  search: {report.rules_loaded} rules, {report.search_ms / 1e3:.2f} s, stop: {report.search_stop}, "
         f"{report.graphs_explored} graphs expanded, {report.graphs_generated} generated")
    echo(f"  {report.nodes_before - report.nodes_opaque} of {report.nodes_before} nodes in the algebra "
         f"({report.nodes_opaque} opaque: carried through, never rewritten); IR {report.ir_nodes_before} -> "
         f"{report.ir_nodes_after} nodes")
    if report.finalists:
        timed = ", ".join(f"#{i + 1} {'-' if f['measured_ms'] is None else format(f['measured_ms'], '.3f')}"
                          for i, f in enumerate(report.finalists))
        chosen = next(i for i, f in enumerate(report.finalists) if f["chosen"]) + 1
        completed = sum(1 for f in report.finalists if f.get("completed"))
        which = f", {completed} of them completions of another's rules" if completed else ""
        figures = [f["measured_ms"] for f in report.finalists if f["measured_ms"] is not None]
        chosen_ms = report.finalists[chosen - 1]["measured_ms"]
        why = "the fastest of the last stage" if chosen_ms is None or not figures or chosen_ms <= min(figures) else \
            f"the one with the fewest nodes of those within {SELECT_TIE:.0%} of the fastest"
        echo(f"  finalists: {len(report.finalists)} graphs timed end to end by successive halving{which}; kept "
             f"#{chosen}, {why} (ms; a graph dropped at an earlier stage was timed on fewer sessions): {timed}")
        estimated = ", ".join(f"#{i + 1} {f['estimated_ms']:.3f}" for i, f in enumerate(report.finalists))
        echo(f"  their estimated costs: {estimated} ms")
    if report.splits_folded or report.elementwise_hoisted or report.channelwise_hoisted:
        echo(f"  then: {report.splits_folded} nested splits folded into one, {report.elementwise_hoisted} elementwise "
             f"ops and {report.channelwise_hoisted} batchnorms applied once before a split"
             + (f" ({report.splits_regridded} split trees cut the other way first, {report.weights_permuted} "
                "matmuls given their weight's columns permuted to line pieces up)"
                if report.splits_regridded or report.weights_permuted else ""))
    if report.steps:
        echo(f"  the search's estimate ({report.cost_model}): {report.cost_before_ms:.3f} ms -> "
             f"{report.cost_after_ms:.3f} ms (a sum over nodes; the measured latency above is the end-to-end run)")
    if report.cost_db is not None:
        echo(f"  cost cache {report.cost_db}: {report.cost_db_hits} hits, {report.nodes_measured} node "
             f"configurations measured in {report.measure_sessions} sessions ({report.measure_ms / 1e3:.2f} s)"
             + (f"; later sessions' kernels took {report.session_scale[0]:.2f}-{report.session_scale[1]:.2f}x the "
                "first's time and were scaled to it" if report.session_scale else ""))
    if report.latency_before_ms is not None and report.steps:
        tested = f"; within {NON_INFERIORITY_MARGIN:.0%}: p = {report.not_slower_p:.2g}" \
            if report.not_slower_p is not None else ""
        echo(f"  A/B: the median of {report.session_pairs} session pairs, {report.timed_runs} interleaved runs; "
             f"faster in {report.faster_pairs} of the pairs, signed-rank p = {report.rank_test_p:.2g}{tested}")

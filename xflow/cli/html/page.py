"""``xflow optimize --html FILE``: one self-contained page of a run (inline CSS and SVG, nothing fetched when it is
viewed): the verdict, the rewrites drawn before -> after, the timings as charts, the operators before -> after, the
check of the outputs, and the certificate's summary when the model carries one. Every string from the model or
the run is escaped."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from xflow.cli.html.charts import latency_chart, pairs_chart
from xflow.cli.html.pictures import ARROW_DEFS, short, step_figure
from xflow.cli.summary import latency_line, ratio_words, readable_bytes, verdict
from xflow.optimize.decision import Decision
from xflow.runtime import NON_INFERIORITY_MARGIN

#: Pictures drawn for the steps of one rule; its further matches are listed by their nodes.
PICTURES_PER_RULE = 2


def render(report: Any, certificate: Mapping[str, Any] | None = None) -> str:
    """The page of ``report`` (an ``OptimizeReport``) and the ``certificate`` the written model carries (None:
    none), as HTML text."""
    import xflow

    sections = [_verdict(report), _rewrites(report), _timings(report), _operators(report), _check(report),
                _certificate(report, certificate)]
    title = f"xflow: {short(str(report.input), 60)}"
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>{ARROW_DEFS}<main>"
            f'<header><h1>xflow optimize</h1><p class="paths"><code>{escape(str(report.input))}</code> &#8594; '
            f"<code>{escape(str(report.output))}</code></p></header>"
            + "".join(s for s in sections if s)
            + f'<footer>xflow {escape(xflow.__version__)} &middot; report schema {report.schema_version}</footer>'
            "</main></body></html>\n")


def _verdict(report: Any) -> str:
    written = Decision(report.outcome).writes_optimized
    facts = [("nodes", f"{report.nodes_before} &#8594; {report.nodes_after}")]
    if report.bytes_before:
        facts.append(("model size", f"{readable_bytes(report.bytes_before)} &#8594; "
                                    f"{readable_bytes(report.bytes_after)}"))
    if report.latency_before_ms is not None:
        after = f" &#8594; {report.latency_after_ms:.3f} ms" if report.steps and report.latency_after_ms else ""
        facts.append(("latency", f"{report.latency_before_ms:.3f} ms{after}"))
        if report.steps and report.speedup:
            facts.append(("ratio", escape(ratio_words(report.speedup))))
    facts.append(("run", f"{report.total_ms / 1e3:.1f} s"))
    cells = "".join(f'<div class="fact"><span>{name}</span><b>{value}</b></div>' for name, value in facts)
    return (f'<section id="verdict" class="{"good" if written else "kept"}"><h2>Verdict</h2>'
            f'<p class="verdict">Wrote {escape(str(report.output))}: {escape(verdict(report))}.</p>'
            f'<div class="facts">{cells}</div></section>')


def _rewrites(report: Any) -> str:
    if not report.steps:
        return ('<section id="rewrites"><h2>Rewrites</h2><p>No rewrite was applied: the search found none that '
                "lowers the cost.</p></section>")
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for step in report.steps:
        by_name.setdefault(step.get("name") or step["rule"], []).append(step)
    kept = Decision(report.outcome).writes_optimized
    note = "" if kept else " (found and checked, but the original was written: see the verdict)"
    parts = [f'<section id="rewrites"><h2>Rewrites</h2><p>{len(report.steps)} step'
             f'{"s" if len(report.steps) != 1 else ""} by {len(by_name)} rule{"s" if len(by_name) != 1 else ""}'
             f'{note}. Boxes are nodes, named by their ONNX op (the node\'s name below); rounded pills are the values '
             "entering and leaving; a dashed arrow: the value becomes another.</p>"]
    for name, steps in by_name.items():
        ids = ", ".join(sorted({s["rule"] for s in steps}))
        parts.append(f'<article class="rule"><h3>{escape(name)} <small>&times;{len(steps)} &middot; '
                     f"<code>{escape(ids)}</code></small></h3>")
        for step in steps[:PICTURES_PER_RULE]:
            if "before" in step:
                parts.append(f'<p class="at">at {escape(", ".join(step["nodes"]))}</p>{step_figure(step)}')
        rest = steps[PICTURES_PER_RULE:]
        if rest:
            places = "; ".join(", ".join(s["nodes"]) for s in rest)
            parts.append(f'<details><summary>{len(rest)} more</summary><p class="at">{escape(places)}</p></details>')
        parts.append("</article>")
    parts.append("</section>")
    return "".join(parts)


def _timings(report: Any) -> str:
    if report.latency_before_ms is None:
        return ""
    timed_after = bool(report.steps and report.latency_after_ms)
    # the first point's ratio is the A/B's (the median pair's); the others' the ratio of their medians
    if report.profile_points:
        points = [(" ".join(f"{k}={v}" for k, v in p["point"].items()), p["latency_before_ms"],
                   p.get("latency_after_ms") if timed_after else None,
                   (report.speedup if k == 0 else p["latency_before_ms"] / p["latency_after_ms"])
                   if timed_after and p.get("latency_after_ms") else None)
                  for k, p in enumerate(report.profile_points)]
    else:
        points = [("the run's shapes", report.latency_before_ms, report.latency_after_ms if timed_after else None,
                   report.speedup if timed_after else None)]
    parts = ['<section id="timings"><h2>Timings</h2>',
             f"<p>{escape(latency_line(report))}: end to end in ONNX Runtime, the median over interleaved runs.</p>",
             latency_chart(points)]
    if report.pairs_ms:
        margin = NON_INFERIORITY_MARGIN if report.not_slower_p is not None else None
        within = (f"; not more than {NON_INFERIORITY_MARGIN:.0%} slower (the dashed line): p = "
                  f"{report.not_slower_p:.2g}" if margin else "")
        tested = f" (one-sided signed-rank test: p = {report.rank_test_p:.2g}{within})" \
            if report.rank_test_p is not None else ""
        parts.append(f"<h3>The A/B, pair by pair</h3><p>{report.session_pairs} pairs of fresh sessions "
                     f"(original, optimized), {report.timed_runs} interleaved runs; the optimized model was faster "
                     f"in {report.faster_pairs} of the pairs{tested}.</p>")
        parts.append(pairs_chart([(a, b) for a, b in report.pairs_ms], margin))
    parts.append("</section>")
    return "".join(parts)


def _operators(report: Any) -> str:
    ops = sorted(set(report.ops_before) | set(report.ops_after))
    rows = []
    for op in ops:
        before, after = report.ops_before.get(op, 0), report.ops_after.get(op, 0)
        changed = ' class="changed"' if before != after else ""
        rows.append(f"<tr{changed}><td>{escape(op)}</td><td>{before or '-'}</td><td>{after or '-'}</td></tr>")
    rows.append(f'<tr class="total"><td>nodes</td><td>{report.nodes_before}</td><td>{report.nodes_after}</td></tr>')
    if report.bytes_before:
        rows.append(f'<tr class="total"><td>model size</td><td>{readable_bytes(report.bytes_before)}</td>'
                    f"<td>{readable_bytes(report.bytes_after)}</td></tr>")
    return ('<section id="operators"><h2>Operators</h2><table><thead><tr><th>op</th><th>before</th><th>after</th>'
            f'</tr></thead><tbody>{"".join(rows)}</tbody></table></section>')


def _check(report: Any) -> str:
    if not report.verified:
        return ""
    worst = max(report.max_abs_diff.values(), default=0.0)
    others = (f"<p>They match at other sizes too: {escape('; '.join(report.checked_at))}.</p>"
              if report.checked_at else "")
    return ('<section id="check"><h2>Outputs</h2><p>The outputs match the original: largest absolute difference '
            f"{worst:.2e}, compared with {escape(report.verify_reference)} on "
            f"{escape(', '.join(report.verify_inputs))}.</p>{others}</section>")


def _certificate(report: Any, certificate: Mapping[str, Any] | None) -> str:
    if certificate is None:
        return ""
    steps = certificate.get("steps", [])
    kinds: dict[str, int] = {}
    for step in steps:
        kinds[step.get("kind", "?")] = kinds.get(step.get("kind", "?"), 0) + 1
    rules = sorted({s["rule"] for s in steps if s.get("kind") == "rule"})
    named = {s["rule"]: s.get("name", s["rule"]) for s in report.steps}
    rule_file = certificate.get("rules", {})
    rows = [("format", certificate.get("format", "")),
            ("steps", ", ".join(_kind_words(k, n) for k, n in kinds.items())),
            ("rules", ", ".join(f"{named.get(r, r)} ({r})" for r in rules) or "none"),
            ("rule file", f"{rule_file.get('path', '')}{' (shipped)' if rule_file.get('shipped') else ''}"),
            ("rule file sha256", rule_file.get("sha256", "")),
            ("input graph", certificate.get("input", {}).get("graph", "")),
            ("output graph", certificate.get("output", {}).get("graph", ""))]
    body = "".join(f"<tr><th>{escape(k)}</th><td><code>{escape(str(v))}</code></td></tr>" for k, v in rows)
    return ('<section id="certificate"><h2>Certificate</h2><p>The written model carries its derivation; '
            f"<code>xflow check {escape(str(report.input))} {escape(str(report.output))}</code> replays it.</p>"
            f'<table class="kv">{body}</table></section>')


_KINDS = {"rule": ("rule application", "rule applications"), "fold": ("constant folding", "constant foldings"),
          "simplification": ("split simplification", "split simplifications"),
          "shapes": ("shape-arithmetic fold/share/delete", "shape-arithmetic folds/shares/deletes"),
          "evaluated": ("constant-subgraph evaluation", "constant-subgraph evaluations"),
          "shared": ("sharing of repeated values", "sharings of repeated values")}


def _kind_words(kind: str, n: int) -> str:
    one, many = _KINDS.get(kind, (kind, kind))
    return f"{n} {one if n == 1 else many}"


_CSS = """
:root{--ink:#111827;--mute:#6b7280;--line:#e5e7eb;--card:#fff;--bg:#f6f7f9;--good:#15803d;--kept:#b45309}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,
"Helvetica Neue",Arial,sans-serif}
main{max-width:1080px;margin:0 auto;padding:24px 20px 40px}
header h1{font-size:22px;margin:0 0 2px}
.paths{margin:0 0 16px;color:var(--mute);word-break:break-all}
code{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:16px 20px;margin:0 0 16px}
h2{font-size:16px;margin:0 0 10px}
h3{font-size:14px;margin:14px 0 6px}
h3 small{font-weight:400;color:var(--mute)}
#verdict{border-left:6px solid var(--good)}
#verdict.kept{border-left-color:var(--kept)}
.verdict{font-size:16px;margin:0 0 12px}
.facts{display:flex;flex-wrap:wrap;gap:10px}
.fact{border:1px solid var(--line);border-radius:8px;padding:6px 12px;min-width:120px}
.fact span{display:block;color:var(--mute);font-size:12px}
.fact b{font-size:15px;font-weight:600}
article.rule{border-top:1px solid var(--line);padding-top:4px}
.at{color:var(--mute);margin:2px 0 4px;font-size:12px;word-break:break-all}
.pair{display:flex;align-items:center;gap:12px;padding:4px 0}
.pair figure{margin:0;border:1px solid var(--line);border-radius:8px;padding:6px 8px;background:#fcfcfd;
min-width:0;flex:0 1 auto}
.pair figure svg{max-width:100%;height:auto;display:block;margin:0 auto}
figcaption{font-size:11px;color:var(--mute);text-transform:uppercase;letter-spacing:.04em}
.pair .arrow{font-size:24px;color:var(--mute)}
svg.graph text{font:12px system-ui,sans-serif;text-anchor:middle;fill:var(--ink)}
svg.graph .opname{font-weight:600}
svg.graph .nodename{font-size:10px;fill:var(--mute)}
svg.graph .op rect{stroke-width:1.2}
svg.graph .before rect{fill:#fee2e2;stroke:#dc2626}
svg.graph .after rect{fill:#dcfce7;stroke:#16a34a}
svg.graph .value rect{fill:#f3f4f6;stroke:#9ca3af}
svg.graph .value text{font-size:11px;fill:#374151}
svg.graph .edge{fill:none;stroke:#6b7280;stroke-width:1.3}
svg.graph .edge.alias{stroke-dasharray:4 3}
.aliases{margin:4px 0 0;padding-left:16px;font-size:12px;color:var(--mute)}
svg.chart{max-width:100%;height:auto;display:block;margin:6px 0 10px}
svg.chart text{font:12px system-ui,sans-serif;fill:var(--ink)}
svg.chart .axis{fill:var(--mute);font-size:11px}
svg.chart .ratio{font-weight:600;font-size:11px}
svg.chart .baseline{stroke:#6b7280;stroke-width:1}
svg.chart .margin{stroke:#b45309;stroke-width:1;stroke-dasharray:4 3}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}
#operators td,#operators th{padding:3px 14px 3px 0;text-align:right;border-bottom:1px solid var(--line)}
#operators td:first-child,#operators th:first-child{text-align:left}
#operators tr.changed td{font-weight:600}
#operators tr.total td{color:var(--mute)}
table.kv th{text-align:left;font-weight:500;color:var(--mute);padding:3px 16px 3px 0;vertical-align:top;
white-space:nowrap}
table.kv td{word-break:break-all;padding:3px 0}
details summary{cursor:pointer;color:var(--mute);font-size:12px}
footer{color:var(--mute);font-size:12px;text-align:center}
"""

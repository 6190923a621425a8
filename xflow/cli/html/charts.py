"""The run's timings as inline SVG charts: the latency before and after at each profile point (bars), and the
A/B's session pairs (each pair's ratio of medians, with the line "as fast")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

BEFORE, AFTER = "#9ca3af", "#2563eb"


def latency_chart(points: Sequence[tuple[str, float, float | None, float | None]]) -> str:
    """Horizontal bars: for each (label, ms before, ms after or None, the ratio before / after or None), the
    original's latency and the optimized model's, with the ratio."""
    label_w, bar_w, row_h, gap = 150.0, 420.0, 20.0, 16.0
    top = max((max(b, a or 0.0) for _, b, a, _ in points), default=1.0) or 1.0
    height = len(points) * (2 * row_h + gap) + 34
    width = label_w + bar_w + 150
    parts = [f'<svg class="chart" id="latency-chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} '
             f'{height:.0f}" width="{width:.0f}" height="{height:.0f}" role="img" '
             'aria-label="latency before and after">']
    y = 8.0
    for label, before, after, ratio in points:
        parts.append(f'<text x="{label_w - 10:.0f}" y="{y + row_h + 4:.0f}" class="axis" text-anchor="end">'
                     f'{escape(label)}</text>')
        for value, colour, who in ((before, BEFORE, "original"), (after, AFTER, "optimized")):
            if value is None:
                continue
            w = max(bar_w * value / top, 1.0)
            parts.append(f'<rect x="{label_w:.0f}" y="{y:.0f}" width="{w:.1f}" height="{row_h - 3:.0f}" '
                         f'fill="{colour}" rx="2"><title>{who}: {value:.3f} ms</title></rect>'
                         f'<text x="{label_w + w + 6:.1f}" y="{y + row_h - 7:.0f}" class="value">{who} '
                         f'{value:.3f} ms</text>')
            y += row_h
        if ratio:
            words = "as fast" if round(ratio, 2) == 1 else (f"{ratio:.2f}x faster" if ratio > 1
                                                           else f"{1 / ratio:.2f}x slower")
            parts.append(f'<text x="{label_w - 10:.0f}" y="{y - 4:.0f}" class="ratio" text-anchor="end">'
                         f'{words}</text>')
        y += gap
    parts.append(_legend(label_w, y + 4, (("original", BEFORE), ("optimized", AFTER))))
    parts.append("</svg>")
    return "".join(parts)


def pairs_chart(pairs: Sequence[tuple[float, float]], margin: float | None) -> str:
    """A dot per session pair: the original's median over the optimized model's (above 1: the optimized model
    faster in that pair), on a log scale, with the line "as fast" and, for a simpler model, the margin it may be
    slower by."""
    width, height, left, right, top, bottom = 600.0, 220.0, 56.0, 16.0, 14.0, 34.0
    ratios = [a / b for a, b in pairs if a > 0 and b > 0]
    logs = [math.log(r) for r in ratios] + [0.0] + ([math.log1p(-margin)] if margin else [])
    lo, hi = min(logs), max(logs)
    pad = max(hi - lo, math.log(1.04)) * 0.12
    lo, hi = lo - pad, hi + pad

    def y_of(ratio: float) -> float:
        return top + (hi - math.log(ratio)) / (hi - lo) * (height - top - bottom)

    step = (width - left - right) / max(len(ratios), 1)
    parts = [f'<svg class="chart" id="pairs-chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} '
             f'{height:.0f}" width="{width:.0f}" height="{height:.0f}" role="img" aria-label="session pairs">',
             f'<line x1="{left:.0f}" x2="{width - right:.0f}" y1="{y_of(1.0):.1f}" y2="{y_of(1.0):.1f}" '
             'class="baseline"/>']
    ticks = [1.0]
    if margin:
        floor = 1.0 - margin
        parts.append(f'<line x1="{left:.0f}" x2="{width - right:.0f}" y1="{y_of(floor):.1f}" y2="{y_of(floor):.1f}" '
                     'class="margin"/>')
        ticks.append(floor)
    ticks += [math.exp(hi - pad), math.exp(lo + pad)]
    shown: list[float] = []
    for tick in ticks:  # a label too near one shown is left out (the line is still drawn)
        if all(abs(y_of(tick) - y_of(other)) >= 13 for other in shown):
            shown.append(tick)
            parts.append(f'<text x="{left - 6:.0f}" y="{y_of(tick) + 4:.1f}" class="axis" text-anchor="end">'
                         f'{tick:.2f}x</text>')
    for k, ((a, b), ratio) in enumerate(zip(pairs, ratios, strict=False)):
        x = left + step * (k + 0.5)
        colour = AFTER if ratio > 1 else "#dc2626"
        parts.append(f'<circle cx="{x:.1f}" cy="{y_of(ratio):.1f}" r="5" fill="{colour}"><title>pair {k + 1}: '
                     f'original {a:.3f} ms, optimized {b:.3f} ms ({ratio:.3f}x)</title></circle>'
                     f'<text x="{x:.1f}" y="{height - bottom + 16:.0f}" class="axis" text-anchor="middle">'
                     f'{k + 1}</text>')
    parts.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 4:.0f}" class="axis" '
                 'text-anchor="middle">session pair (original\'s median / optimized model\'s: above the line, '
                 'faster)</text></svg>')
    return "".join(parts)


def _legend(x: float, y: float, entries: Sequence[tuple[str, str]]) -> str:
    out = []
    for label, colour in entries:
        out.append(f'<rect x="{x:.0f}" y="{y:.0f}" width="12" height="12" fill="{colour}" rx="2"/>'
                   f'<text x="{x + 18:.0f}" y="{y + 10:.0f}" class="axis">{escape(label)}</text>')
        x += 18 + 8 * len(label) + 20
    return "".join(out)

"""The README's chart: each real export's measured speedup over the original for xflow and its peers (onnxsim,
onnxslim, ONNX Runtime's transformer optimizer), one row per model, from ``xflow bench --json`` output or from the
real-exports table of ``docs/RESULTS.md`` (the figures are the measured ones; nothing is timed here).

    .venv/bin/python benchmarks/results_chart.py --out docs/bench.png                  # from docs/RESULTS.md
    .venv/bin/python benchmarks/results_chart.py --json bench.json --out docs/bench.png
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = (("xflow", "xflow speedup", "#2563eb", "o"), ("onnxslim", "onnxslim speedup", "#f59e0b", "s"),
         ("onnxsim", "onnxsim speedup", "#10b981", "D"),
         ("ORT transformers", "ORT transformers speedup", "#9ca3af", "^"))
BENCH_KEYS = {"xflow": "xflow", "onnxslim": "onnxslim", "onnxsim": "onnxsim", "ORT transformers": "ort-transformers"}


def from_results(path: Path, heading: str = "## Real exports") -> tuple[dict[str, dict[str, float]], str]:
    """The speedups of the first table under ``heading`` in RESULTS.md, by model and tool (a peer whose outputs
    differ is left out), and the paragraph before the table (where and when it was measured)."""
    text = path.read_text(encoding="utf-8")
    section = text[text.index(heading) + len(heading):]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| model |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows: dict[str, dict[str, float]] = {}
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if set(cells[0]) <= {"-", " "} or cells[0].startswith("**"):  # separator rows, the geomean row
            continue
        row = {}
        for tool, column, _, _ in TOOLS:
            cell = cells[header.index(column)]
            found = re.match(r"\**([0-9.]+)×", cell)
            if found and "differ" not in cell:
                row[tool] = float(found.group(1))
        rows[cells[0]] = row
    return rows, " ".join(lines[:start]).strip()


def from_bench_json(path: Path) -> dict[str, dict[str, float]]:
    """The speedups of ``xflow bench --json`` output (a list of rows), by model and tool."""
    rows = {}
    for entry in json.loads(path.read_text(encoding="utf-8")):
        drifted = set(entry.get("drifted", []))
        rows[entry["model"]] = {tool: entry["speedup"][key] for tool, key in BENCH_KEYS.items()
                                if key in entry.get("speedup", {}) and key not in drifted}
    return rows


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def draw(rows: dict[str, dict[str, float]], out: Path, subtitle: str) -> None:
    """A dot per model and tool (speedup, log scale), models sorted by xflow's, the geomeans last."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted(rows, key=lambda m: rows[m].get("xflow", 0.0))
    means = {tool: geomean([rows[m][tool] for m in models if tool in rows[m]])
             for tool, *_ in TOOLS if any(tool in rows[m] for m in models)}
    labels = ["geomean", *models]
    fig, ax = plt.subplots(figsize=(7.6, 0.3 * len(labels) + 1.5), dpi=100)
    ax.set_axisbelow(True)
    ax.axvline(1.0, color="#374151", linewidth=1.0, zorder=1)
    ax.axhspan(-0.5, 0.5, color="#f3f4f6", zorder=0)
    for tool, _, colour, marker in TOOLS:
        if tool not in means:
            continue
        ys = [0, *(k + 1 for k, m in enumerate(models) if tool in rows[m])]
        xs = [means[tool], *(rows[m][tool] for m in models if tool in rows[m])]
        size = [46 if tool == "xflow" else 30] * len(xs)
        ax.scatter(xs, ys, s=size, marker=marker, color=colour, zorder=3 if tool == "xflow" else 2,
                   label=f"{tool} (geomean {means[tool]:.3f}×)", edgecolors="white", linewidths=0.5)
    ax.set_yticks(range(len(labels)), labels, fontsize=9)
    ax.get_yticklabels()[0].set_fontweight("bold")
    ax.set_ylim(-0.7, len(labels) - 0.3)
    ax.set_xscale("log")
    low = min(min(r.values()) for r in rows.values() if r)
    high = max(max(r.values()) for r in rows.values() if r)
    ax.set_xlim(min(low, 0.95) * 0.99, high * 1.02)
    ticks = [t for t in (0.92, 0.95, 0.97, 1.0, 1.03, 1.05, 1.1, 1.15, 1.2, 1.3, 1.5) if low * 0.98 <= t <= high * 1.02]
    ax.set_xticks(ticks, [f"{t:.2f}×" for t in ticks], fontsize=8)
    ax.minorticks_off()
    ax.grid(axis="x", color="#e5e7eb", linewidth=0.6, zorder=0)
    ax.set_xlabel("speedup over the original model (ONNX Runtime latency; right of the line: faster)", fontsize=9)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title("xflow and its peers on real exports, measured", fontsize=11, loc="left", fontweight="bold")
    fig.text(0.01, 0.005, subtitle, fontsize=7, color="#6b7280", ha="left", va="bottom")
    ax.legend(loc="lower right", fontsize=8, frameon=True, framealpha=0.95)
    fig.tight_layout(rect=(0, 0.025, 1, 1))
    fig.savefig(out, dpi=100, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="xflow bench --json output (default: RESULTS.md)")
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "RESULTS.md")
    parser.add_argument("--subtitle", default=None, help="where and when the figures were measured")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench.png")
    args = parser.parse_args()
    if args.json is not None:
        rows, subtitle = from_bench_json(args.json), args.subtitle or f"from {args.json.name}"
    else:
        rows, _ = from_results(args.results)
        subtitle = args.subtitle or ("docs/RESULTS.md (real exports, 2026-11-29): ONNX Runtime 1.32.0, 2 threads, "
                                     "AMD EPYC Zen 4; onnxsim 0.8.1, onnxslim 0.1.98")
    draw(rows, args.out, subtitle)
    print(f"{args.out}: {len(rows)} models, {args.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()

"""``xflow bench``: the zoo and given models, original vs optimized, per provider (``xflow.bench``)."""

from __future__ import annotations

import os
import sys

import click

from xflow.cli.common import check_writable, require_onnxruntime, user_errors, write_json
from xflow.cli.options import BENCH_DEFAULTS, OPTIMIZE_DEFAULTS, RULES_HELP, THREADS_HELP
from xflow.files import check_distinct


@click.command()
@click.argument("models", nargs=-1, metavar="[MODEL | FILE.onnx]...")
@click.option("--rules", "rules_path", type=click.Path(), default=None, help=RULES_HELP)
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default=OPTIMIZE_DEFAULTS.runtime.provider,
              show_default=True,
              help="ONNX Runtime execution provider for costs and timing.")
@click.option("--threads", type=int, default=None, help=THREADS_HELP)
@click.option("--small", is_flag=True, help="Reduced zoo variants (quick runs).")
@click.option("--budget", type=int, default=OPTIMIZE_DEFAULTS.search.budget, show_default=True,
              help="Search budget per model.")
@click.option("--patience", type=click.IntRange(min=0), default=OPTIMIZE_DEFAULTS.search.patience or 0,
              show_default=True,
              help="Stop each search after this many expansions without a cheaper graph (0: never).")
@click.option("--time-limit", type=float, default=OPTIMIZE_DEFAULTS.search.time_limit, show_default=True,
              help="Search time limit per model (s).")
@click.option("--seconds", type=float, default=BENCH_DEFAULTS.seconds_per_model, show_default=True,
              help="About how long to time each model's variants (interleaved).")
@click.option("--sessions", type=click.IntRange(min=1), default=BENCH_DEFAULTS.sessions_per_variant, show_default=True,
              help="ORT sessions per variant, timed interleaved; a variant's latency is the median of its "
                   "sessions' medians (one session's luck lasts its life). Use 1 for models near memory limits.")
@click.option("--num-heads", type=click.IntRange(min=1), default=None,
              help="Attention heads, for ORT's transformer optimizer on a model with a KV cache (its gpt2 type "
                   "needs them; default: read from the graph).")
@click.option("--hidden-size", type=click.IntRange(min=1), default=None,
              help="Hidden size, for ORT's transformer optimizer on a model with a KV cache (default: the width of "
                   "the embedding table the token ids gather from).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write the markdown table (command, machine, date, rows) to this file.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Every figure as JSON.")
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG bar chart of the speedups.")
@user_errors
def bench(models: tuple[str, ...], rules_path: str | None, provider: str, threads: int | None, small: bool,
          budget: int, patience: int, time_limit: float, seconds: float, sessions: int, num_heads: int | None,
          hidden_size: int | None, out_path: str | None,
          json_path: str | None, chart_path: str | None) -> None:
    """Benchmark xflow on zoo models (default: all) and ONNX files.

    For each model: nodes before/after, rules applied, search time with a cold and a warm cost cache,
    and latency at ORT_ENABLE_ALL of the original, xflow's output (verified, never slower), onnxsim's,
    onnxslim's and onnxscript's optimize_for_ort's (when installed) and ORT's transformer optimizer's
    (transformer models; its gpt2 type for a model with a KV cache), in the same interleaved runs. A model with
    dynamic dims is timed at the first size xflow optimize measures at (a decode step for a KV cache).
    """
    require_onnxruntime()
    from dataclasses import asdict

    from xflow import zoo
    from xflow.bench import COLUMNS, HEADER, BenchSettings, format_table, onnxsim_available, run_bench, write_chart

    check_distinct({**{f"MODEL {path}": path for path in models if os.path.isfile(path)}, "--rules": rules_path,
                    "--out": out_path, "--json": json_path, "--chart": chart_path})
    for path in (out_path, json_path, chart_path):
        if path:
            check_writable(path)
    settings = BenchSettings(rules_path=rules_path, provider=provider, threads=threads, small=small, budget=budget,
                             patience=patience or None, time_limit=time_limit, seconds_per_model=seconds,
                             sessions_per_variant=sessions, num_heads=num_heads, hidden_size=hidden_size)
    if not onnxsim_available():
        click.echo("note: onnxsim is not installed, so it is left out (pip install 'xflow-opt[bench]')", err=True)
    click.echo(HEADER)
    click.echo("| " + " | ".join("---" for _ in range(COLUMNS)) + " |")
    rows = run_bench(list(models) or list(zoo.MODELS), settings, say=click.echo)
    table = format_table(rows, settings, "xflow bench " + " ".join(sys.argv[2:]))
    click.echo("\n".join(table.splitlines()[len(rows) + 4:]))  # geomean row and notes
    if out_path:
        with open(out_path, "w", encoding="utf-8") as f:
            f.write(table)
    if json_path:
        write_json(json_path, [asdict(r) for r in rows])
    if chart_path:
        write_chart(rows, chart_path)


COMMANDS: list[click.Command] = [bench]

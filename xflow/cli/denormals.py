"""``xflow denormals``: whether a model runs into denormal arithmetic, and what flushing it would gain."""

from __future__ import annotations

import os
import statistics

import click

from xflow.cli.common import check_writable, require_onnxruntime, user_errors, write_json
from xflow.cli.options import THREADS_HELP
from xflow.files import check_distinct


@click.command()
@click.argument("models", nargs=-1, required=True, metavar="FILE.onnx...")
@click.option("--threads", type=click.IntRange(min=1), default=None, help=THREADS_HELP)
@click.option("--processes", type=click.IntRange(min=2, max=8), default=5, show_default=True,
              help="Processes per side (with and without the flush), alternating.")
@click.option("--seconds", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="About how long each process times the model (at least 5 runs).")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=D1xD2...",
              help="Run a dynamic input at this shape (default: 1 for each dynamic dim). Repeatable.")
@click.option("--inputs", "inputs_npz", type=click.Path(), default=None,
              help="An .npz of input arrays (default: seeded random).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for random inputs.")
@click.option("--where", type=click.IntRange(min=0), default=5, show_default=True,
              help="Where flushing is faster, name the nodes it saves the most time in (one profiled process a "
                   "side; 0: none).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Every figure as JSON.")
@user_errors
def denormals(models: tuple[str, ...], threads: int | None, processes: int, seconds: float,
              input_shapes: tuple[str, ...], inputs_npz: str | None, seed: int, where: int,
              json_path: str | None) -> None:
    """Time each model in ONNX Runtime with and without flushing denormals to zero.

    Values below float32's smallest normal (1.2e-38) run many times slower on x86 cores; a softmax over scores
    masked with -100 (Swin's shifted windows) makes them. ONNX Runtime's session option
    session.set_denormal_as_zero=1 flushes them, which changes only such values: xflow reports what it gains and
    how far the outputs move, and leaves the choice to you (it never writes it into a model). Each side runs in
    processes of its own, alternating; "faster" is an exact rank test over them at p < 0.01.
    """
    require_onnxruntime()
    from xflow.denormals import FLUSH_KEY, check_denormals
    from xflow.onnx_io import parse_input_shapes, read_model
    from xflow.onnx_io.load import check_input_shapes
    from xflow.optimize import read_inputs

    check_distinct({**{f"FILE.onnx {path}": path for path in models}, "--inputs": inputs_npz, "--json": json_path})
    if json_path:
        check_writable(json_path)
    shapes = parse_input_shapes(input_shapes)
    if inputs_npz:
        read_inputs(inputs_npz)  # a bad file fails here, in one line, before any model is timed
    for path in models:  # every file checked before the first is timed
        check_input_shapes(read_model(path), shapes, path)
    checks = []
    for path in models:
        check = check_denormals(path, threads or os.cpu_count() or 1, processes, seconds, seed, shapes, inputs_npz,
                                where)
        checks.append(check)
        default, flushed = (f"{statistics.median(ms):.2f} ms" for ms in (check.default_ms, check.flushed_ms))
        moved = "bit for bit the same" if check.identical else \
            f"max abs diff {max(check.max_abs_diff.values(), default=0.0):.2e}"
        if check.faster():
            click.echo(f"{path}: {check.speedup:.2f}x faster with {FLUSH_KEY}=1 ({flushed} against {default}, "
                       f"medians of {processes} processes each, rank test p = {check.p_value:.2g}); outputs on "
                       f"{check.inputs}: {moved}")
            for node in check.nodes:
                click.echo(f"  {node.op_type} {node.name}: {node.default_ms:.3f} -> {node.flushed_ms:.3f} ms a run")
        else:
            click.echo(f"{path}: not measurably faster with {FLUSH_KEY}=1 ({check.speedup:.3f}x: {flushed} against "
                       f"{default}, p = {check.p_value:.2g}); outputs on {check.inputs}: {moved}")
    if any(check.faster() for check in checks):
        click.echo(f"  to flush: sess_options.add_session_config_entry(\"{FLUSH_KEY}\", \"1\") before creating the "
                   "session; values below 1.2e-38 become zero")
    if json_path:
        write_json(json_path, [check.to_json() for check in checks])


COMMANDS: list[click.Command] = [denormals]

"""``xflow zoo NAME OUT``: write a benchmark model of ``xflow.zoo``."""

from __future__ import annotations

import click

from xflow.cli.common import check_writable, save_model, user_errors
from xflow.errors import XflowError


@click.command()
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


COMMANDS: list[click.Command] = [zoo]

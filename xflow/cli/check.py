"""``xflow check IN OUT``: does OUT compute what IN computes, by its certificate (``xflow.check``)? Each rule the
certificate applies is re-proved with the verifier, as ``xflow verify-rules`` does."""

from __future__ import annotations

import sys

import click

from xflow.cli.common import user_errors
from xflow.cli.options import proof_budget_options


@click.command("check")
@click.argument("in_path", metavar="IN.onnx", type=click.Path())
@click.argument("out_path", metavar="OUT.onnx", type=click.Path())
@click.option("--certificate", "certificate_path", type=click.Path(dir_okay=False), default=None,
              help="The certificate to check (a JSON file, or a model carrying one); default: the one OUT carries.")
@click.option("--rules", "rules_path", type=click.Path(dir_okay=False), default=None,
              help="The rule file to find the certificate's rules in (default: the one it names).")
@proof_budget_options
@user_errors
def check(in_path: str, out_path: str, certificate_path: str | None, rules_path: str | None, rlimit: int,
          guard_s: float) -> None:
    """Check that OUT.onnx is what its certificate's steps make of IN.onnx: each rule in the rule file with the
    content hash stated and re-proved from the operator axioms, each match and its conditions re-established for
    every value of the symbolic dims, folded constants recomputed, and the result equal to OUT (interface, nodes,
    weights byte for byte).

    Prints one line; exits 0 when OUT checks, 1 when it does not (naming the first step that fails and why),
    2 on bad input.
    """
    from xflow.check.check import check as check_models
    from xflow.rules import Rule
    from xflow.verifier.prove import prove_rule

    def prove(rule: Rule) -> str | None:
        result = prove_rule(rule, rlimit=rlimit, guard_s=guard_s)
        return None if result.status == "proved" else f"{result.status}: {result.reason}".rstrip(": ")

    verdict = check_models(in_path, out_path, certificate_path, rules_path, prove)
    click.echo(verdict.line)
    if not verdict.ok:
        sys.exit(1)


COMMANDS: list[click.Command] = [check]

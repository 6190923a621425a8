"""False-positive rate of the A/B decision that ``xflow optimize`` makes before it writes a model.

A model is timed against a byte-identical copy of itself with ``decide_ab`` (the decision and settings the
verify pass uses: pairs of fresh sessions, a sequential signed-rank test over them, looking after 8, 10, ... pairs
with bounds that keep its overall level at 0.01); the copy is "faster" only by chance.
Each trial is one full decision; the rate is the share of trials that would have kept the copy. The
verify pass's promise: at least 99 of 100 reverted. ``--one-pair`` measures one pair's round-level sign test
alone (``measure_ab``), the decision before pairs of sessions were its unit.

    .venv/bin/python benchmarks/ab_false_positive.py [--trials 100] [--models matmul,nasrnn] [--one-pair]
    .venv/bin/python benchmarks/ab_false_positive.py --trials 5 --models bert.onnx --against bert.opt.onnx
    .venv/bin/python benchmarks/ab_false_positive.py --not-slower [--against slower.onnx]

Prints one line per model with the trials, the copies kept, the rate, the rounds, session pairs and
seconds per decision, and a one-sided 95% upper bound on the rate (Clopper-Pearson). Run it on an idle machine and
under load (the figures in docs/lab-notes say which).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from xflow import zoo
from xflow.ort import open_session
from xflow.runtime import NON_INFERIORITY_MARGIN, decide_ab, measure_ab, random_feeds


def matmul_chain(depth: int = 4, width: int = 256) -> onnx.ModelProto:
    """x @ W, depth times: a model of a few hundred microseconds."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", [f"h{k}", "W"], [f"h{k + 1}"]) for k in range(depth)]
    model = helper.make_model(helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [64, width])],
        [helper.make_tensor_value_info(f"h{depth}", TensorProto.FLOAT, [64, width])],
        [numpy_helper.from_array((rng.standard_normal((width, width)) / 16).astype(np.float32), "W")]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


MODELS = {"matmul": matmul_chain, "nasrnn": lambda: zoo.build("nasrnn", small=True),
          "squeezenet": lambda: zoo.build("squeezenet", small=True)}


def upper_bound(kept: int, trials: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound on a rate seen ``kept`` times in ``trials`` (bisection on the
    binomial tail, no scipy)."""
    from math import comb

    def tail(p: float) -> float:  # P(X <= kept) for X ~ Binomial(trials, p)
        return sum(comb(trials, k) * p ** k * (1 - p) ** (trials - k) for k in range(kept + 1))

    lo, hi = kept / trials, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tail(mid) > 1 - confidence else (lo, mid)
    return hi


def run(name: str, trials: int, confirm: bool = True, against: bytes | None = None,
        threads: int | None = None, not_slower: bool = False) -> dict[str, float]:
    """``trials`` A/B decisions of the model against its identical copy (or ``against``, another model of
    the same function: the share kept is then the decision's power): ``decide_ab`` as the verify pass makes
    them, or one ``measure_ab`` (``confirm=False``, a round-level sign test on one pair). With ``not_slower``,
    the decision a simpler model gets (``NON_INFERIORITY_MARGIN``) and "kept" is its "not slower": for an
    identical copy, how often an equally fast simpler model is written; ``against`` a slower one (by more than
    the margin), how often it is written wrongly."""
    data = open(name, "rb").read() if name.endswith(".onnx") else MODELS[name]().SerializeToString()
    other = data if against is None else against
    kept, rounds, seconds, pairs = 0, [], [], []
    for _ in range(trials):
        # Fresh sessions each trial, as each `xflow optimize` run builds them: where their weights land in
        # memory differs from one pair to the next and can make one copy persistently faster.
        a, b = open_session(data, threads=threads), open_session(other, threads=threads)
        feeds = random_feeds(a, 0)
        start = time.perf_counter()
        if confirm:
            ab = decide_ab(a, b, feeds, lambda side: open_session(data if side == "a" else other, threads=threads),
                           margin=NON_INFERIORITY_MARGIN if not_slower else None)
        else:
            ab = measure_ab(a, b, feeds)
        seconds.append(time.perf_counter() - start)
        rounds.append(ab.runs)
        pairs.append(getattr(ab, "pairs", 1))
        kept += ab.b_is_not_slower() if not_slower else ab.b_is_faster()
    return {"trials": trials, "kept": kept, "rate": kept / trials, "upper95": upper_bound(kept, trials),
            "rounds": statistics.median(rounds), "seconds": statistics.median(seconds),
            "pairs": statistics.mean(pairs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--models", default="matmul,nasrnn", help="zoo/test models by name, or ONNX files")
    parser.add_argument("--against", help="an ONNX file of the same function to time each model against "
                        "(its share kept is the decision's power on a real gain)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--one-pair", action="store_true",
                        help="One measure_ab per decision: a round-level sign test on one pair.")
    parser.add_argument("--not-slower", action="store_true",
                        help="Count the non-inferiority test's 'not slower' (1%% margin), the rule a simpler model "
                             "is written by, instead of 'faster'.")
    args = parser.parse_args()
    print("| model | trials | copy kept | false-positive rate | 95% upper bound | rounds (median) "
          "| session pairs (mean) | s per decision |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        against = open(args.against, "rb").read() if args.against else None
        r = run(name, args.trials, confirm=not args.one_pair, against=against, threads=args.threads,
                not_slower=args.not_slower)
        print(f"| {name} | {r['trials']} | {r['kept']} | {r['rate']:.1%} | {r['upper95']:.1%} | {r['rounds']:.0f} "
              f"| {r['pairs']:.1f} | {r['seconds']:.1f} |", flush=True)


if __name__ == "__main__":
    main()

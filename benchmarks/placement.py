"""Placement benchmark: RL vs heuristics over the zoo on the simulated topologies, zero-shot transfer,
simulator calibration (Kendall tau) against the real CPU executor, and RL vs baselines measured for real.

Rerunnable; every figure goes to --out-dir (JSON, markdown tables, PNG charts):

    .venv/bin/python benchmarks/placement.py                 # everything (about 40 min on 2 cores)
    .venv/bin/python benchmarks/placement.py --part sim --models inception_v3,bert
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

from xflow import zoo
from xflow.cost import AnalyticCost
from xflow.onnx_io import graph_from_model
from xflow.placement.place import PlaceOptions, place_graph, train_across, training_curve_png, validate_simulator
from xflow.placement.simulator import INFEASIBLE_SECONDS, SimParams
from xflow.placement.topology import load_topology
from xflow.placement.train import TrainOptions

SIM_TOPOLOGIES = ("4xgpu-pcie", "2xgpu-memcap", "8xgpu-nvlink")
HEURISTICS = ("round-robin", "min-cut", "m-etf")


def cost_model(kind: str):  # noqa: ANN201
    if kind == "analytic":
        return AnalyticCost()
    from xflow.cost.cache import CostCache
    from xflow.cost.measured import MeasuredCost

    return MeasuredCost("cpu", cache=CostCache())


def ms(seconds: float) -> str:
    return "infeasible" if seconds >= INFEASIBLE_SECONDS else f"{seconds * 1e3:.2f}"


def run_sim(models: list[str], topologies: list[str], args, out: str) -> list[dict]:  # noqa: ANN001
    """RL (from scratch) and every baseline, per model and simulated topology."""
    rows = []
    costs = cost_model(args.cost)
    for name in models:
        graph = graph_from_model(zoo.build(name, small=args.small))
        for topo_name in topologies:
            topo = load_topology(topo_name)
            options = PlaceOptions(train=TrainOptions(time_limit=args.train_seconds, seed=args.seed))
            outcome = place_graph(graph, topo, options, costs, name)
            plan = outcome.plan
            baselines = plan.baselines
            best_baseline = min(baselines.values())
            best_heuristic = min(baselines[k] for k in HEURISTICS)
            rl = plan.rl["seconds"]
            rl_improved = plan.rl.get("improved_seconds", rl)
            row = {"model": name, "topology": topo_name, "nodes": plan.extra["nodes"], "groups": plan.rl["groups"],
                   "baselines": baselines, "rl": rl, "rl_improved": rl_improved,
                   "rl_vs_best_baseline": rl / best_baseline,
                   "rl_improved_vs_best_baseline": rl_improved / best_baseline,
                   "rl_improved_vs_best_heuristic": rl_improved / best_heuristic,
                   "planning_seconds": outcome.seconds, "train_seconds": plan.rl.get("train_seconds"),
                   "evaluations": plan.rl.get("evaluations"), "steps": plan.rl.get("steps")}
            rows.append(row)
            print(f"{name:13s} {topo_name:13s} best baseline {ms(best_baseline)} ms, best heuristic "
                  f"{ms(best_heuristic)}, RL {ms(rl)} ({row['rl_vs_best_baseline']:.3f}x), RL+improve "
                  f"{ms(rl_improved)} ({row['rl_improved_vs_best_baseline']:.3f}x), planning {outcome.seconds:.0f} s",
                  flush=True)
            if outcome.curve:
                training_curve_png(outcome.curve, os.path.join(out, f"curve_{name}_{topo_name}.png"),
                                   f"{name} on {topo_name}")
            _dump(out, "sim.json", rows)
    return rows


def run_transfer(args, out: str) -> list[dict]:  # noqa: ANN001
    """One policy trained on part of the zoo places the held-out models zero-shot; compared with
    training RL on each held-out model itself (neither with the improvement pass)."""
    train_names = args.train_on.split(",")
    held_out = [m for m in zoo.MODELS if m not in train_names]
    topo = load_topology(args.transfer_topology)
    costs = cost_model(args.cost)
    graphs = {n: graph_from_model(zoo.build(n, small=args.small)) for n in train_names}
    started = time.perf_counter()  # steps only (no time limit): the same seed gives the same policy anywhere
    policy, _ = train_across(graphs, topo, PlaceOptions(train=TrainOptions(seed=args.seed),
                                                        transfer_steps=args.transfer_steps), costs)
    train_seconds = time.perf_counter() - started
    rows = []
    for name in held_out:
        graph = graph_from_model(zoo.build(name, small=args.small))
        zero = place_graph(graph, topo, PlaceOptions(policy=policy, improve_sweeps=0,
                                                     zero_shot_samples=args.zero_shot_samples,
                                                     zero_shot_temperature=args.zero_shot_temperature), costs, name)
        own = place_graph(graph, topo, PlaceOptions(improve_sweeps=0, train=TrainOptions(
            time_limit=args.train_seconds, seed=args.seed)), costs, name)
        row = {"model": name, "topology": topo.name, "zero_shot": zero.plan.rl["seconds"],
               "zero_shot_seconds": zero.seconds, "per_model": own.plan.rl["seconds"],
               "per_model_seconds": own.seconds, "gap": zero.plan.rl["seconds"] / own.plan.rl["seconds"] - 1,
               "best_baseline": min(own.plan.baselines.values()), "trained_on": train_names,
               "zero_shot_samples": args.zero_shot_samples, "zero_shot_temperature": args.zero_shot_temperature,
               "transfer_steps": args.transfer_steps, "train_seconds": train_seconds}
        rows.append(row)
        print(f"zero-shot {name:13s} {ms(row['zero_shot'])} ms vs per-model RL {ms(row['per_model'])} ms: "
              f"gap {row['gap'] * 100:+.1f}% (placing took {zero.seconds:.1f} s)", flush=True)
        _dump(out, "transfer.json", rows)
    return rows


def run_real(args, out: str) -> dict:  # noqa: ANN001
    """Calibrate and validate the simulator on the real CPU executor (topology `cpu`: two 1-thread CPU
    devices), then plan with the calibrated simulator and measure RL's and every baseline's plan."""
    from xflow.placement.executor import Executor
    from xflow.placement.problem import build_problem

    topo = load_topology("cpu")
    costs = cost_model(args.cost)
    result = {"validation": [], "measured": []}
    for name in args.real_models.split(","):
        graph = graph_from_model(zoo.build(name, small=True))
        report = validate_simulator(graph, topo, costs, placements=args.placements, runs=args.runs, seed=args.seed)
        report["model"] = name
        result["validation"].append(report)
        print(f"calibration {name:13s} tau {report['tau_uncalibrated']:.3f} uncalibrated -> {report['tau']:.3f} "
              f"calibrated over {report['placements']} held-out random placements "
              f"(log RMSE {report['log_rmse_validation']:.3f})", flush=True)
        params = SimParams(**report["params"])
        outcome = place_graph(graph, topo, PlaceOptions(sim_params=params, train=TrainOptions(
            time_limit=args.train_seconds, seed=args.seed)), costs, name)
        plan = outcome.plan
        problem = build_problem(graph, costs, name)
        executor = Executor(problem, topo, runs=args.runs * 3, seed=args.seed)
        from xflow.placement.baselines import all_baselines
        from xflow.placement.groups import make_groups
        from xflow.placement.simulator import Simulator

        grouping = make_groups(problem, topo)
        plans = all_baselines(grouping, Simulator(problem, topo, params))
        plans["rl (chosen)"] = plan.devices_for(problem)
        measured = {k: executor.runtime(v) for k, v in plans.items()}
        executor.close()
        result["measured"].append({"model": name, "chosen": plan.chosen, "measured": measured,
                                   "simulated": {**plan.baselines, "rl": plan.rl["seconds"]}})
        print(f"measured   {name:13s} " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in measured.items()), flush=True)
        _dump(out, "real.json", result)
    return result


def _dump(out: str, name: str, data: object) -> None:
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)


def sim_chart(rows: list[dict], path: str) -> None:
    """Bars: each method's step time relative to the best baseline, per model, one panel per topology."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    topologies = list(dict.fromkeys(r["topology"] for r in rows))
    fig, axes = plt.subplots(len(topologies), 1, figsize=(9, 3 * len(topologies)), squeeze=False)
    methods = ["best single", *HEURISTICS, "rl", "rl+improve"]
    for ax, topo in zip(axes[:, 0], topologies, strict=True):
        sub = [r for r in rows if r["topology"] == topo]
        x = np.arange(len(sub))
        for i, method in enumerate(methods):
            values = []
            for r in sub:
                best = min(r["baselines"].values())
                v = {"best single": min(v for k, v in r["baselines"].items() if k.startswith("single")),
                     "rl": r["rl"], "rl+improve": r["rl_improved"]}.get(method, r["baselines"].get(method))
                values.append(min(v / best, 3.0))
            ax.bar(x + i * 0.13, values, 0.13, label=method)
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set_xticks(x + 0.33, [r["model"] for r in sub])
        ax.set_ylabel("time / best baseline")
        ax.set_title(topo)
    axes[0, 0].legend(ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def markdown(rows: list[dict], transfer: list[dict]) -> str:
    lines = ["| model | topology | groups | best single | round-robin | min-cut | m-ETF | RL | RL+improve | "
             "RL / best baseline | RL+improve / best baseline | planning s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"] if rows else []
    for r in rows:
        single = min(v for k, v in r["baselines"].items() if k.startswith("single"))
        lines.append(f"| {r['model']} | {r['topology']} | {r['groups']} | {ms(single)} | "
                     + " | ".join(ms(r["baselines"][k]) for k in HEURISTICS)
                     + f" | {ms(r['rl'])} | {ms(r['rl_improved'])} | {r['rl_vs_best_baseline']:.3f} | "
                     f"{r['rl_improved_vs_best_baseline']:.3f} | {r['planning_seconds']:.0f} |")
    if transfer:
        lines += [""] * bool(lines)
        lines += ["| held-out model | zero-shot ms | per-model RL ms | gap | best baseline ms | placing s |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {t['model']} | {ms(t['zero_shot'])} | {ms(t['per_model'])} | {t['gap'] * 100:+.1f}% | "
                  f"{ms(t['best_baseline'])} | {t['zero_shot_seconds']:.1f} |" for t in transfer]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["all", "sim", "transfer", "real"], default="all")
    parser.add_argument("--models", default=",".join(zoo.MODELS))
    parser.add_argument("--topologies", default=",".join(SIM_TOPOLOGIES))
    parser.add_argument("--cost", choices=["analytic", "measured"], default="analytic")
    parser.add_argument("--small", action="store_true", help="small zoo variants (quick check)")
    parser.add_argument("--train-seconds", type=float, default=60.0)
    parser.add_argument("--train-on", default="resnet50,squeezenet,bert,nasrnn")
    parser.add_argument("--transfer-topology", default="4xgpu-pcie")
    parser.add_argument("--transfer-steps", type=int, default=PlaceOptions.transfer_steps,
                        help="training steps of the transfer policy (no time limit)")
    parser.add_argument("--zero-shot-samples", type=int, default=PlaceOptions.zero_shot_samples,
                        help="placements sampled from the policy; the fastest in the simulator is kept")
    parser.add_argument("--zero-shot-temperature", type=float, default=PlaceOptions.zero_shot_temperature)
    parser.add_argument("--real-models", default="squeezenet,inception_v3,nasrnn")
    parser.add_argument("--placements", type=int, default=30)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default="benchmarks/placement_results")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, f"machine_{args.part}.json"), "w", encoding="utf-8") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "machine": platform.platform(),
                   "args": vars(args)}, f, indent=2)
    rows: list[dict] = []
    transfer: list[dict] = []
    if args.part in ("all", "sim"):
        rows = run_sim(args.models.split(","), args.topologies.split(","), args, args.out_dir)
        sim_chart(rows, os.path.join(args.out_dir, "placement_sim.png"))
    if args.part in ("all", "transfer"):
        transfer = run_transfer(args, args.out_dir)
    if args.part in ("all", "real"):
        run_real(args, args.out_dir)
    if rows or transfer:
        with open(os.path.join(args.out_dir, f"{args.part}.md"), "w", encoding="utf-8") as f:
            f.write(markdown(rows, transfer))


if __name__ == "__main__":
    main()

"""Placement benchmark: RL vs heuristics over the zoo on the simulated topologies, zero-shot transfer,
simulator calibration (Kendall tau) against the real CPU executor, and RL vs baselines measured for real.

Rerunnable; every figure goes to --out-dir (JSON, markdown tables, PNG charts):

    .venv/bin/python benchmarks/placement.py --part sim      # zoo x 3 topologies x (fresh, warm): about 45 min
    .venv/bin/python benchmarks/placement.py --part sim --models '' --onnx /tmp/real/*.onnx --starts warm \
        --out-dir benchmarks/placement_results/exported   # exported models (benchmarks/export_real.py)
    .venv/bin/python benchmarks/placement.py --part transfer # 3 seeds: about 30 min (--policy-dir DIR keeps the
                                                             # trained policies for the next run)
    .venv/bin/python benchmarks/placement.py --part real --time-limit 20  # Kendall tau on this CPU: 6 min

Costs are measured with ONNX Runtime through the SQLite cache by default (``--cost analytic`` for the
analytic model); step times are the simulator's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from xflow import zoo
from xflow.cost import AnalyticCost
from xflow.onnx_io import graph_from_model, load
from xflow.placement.measure import validate_simulator
from xflow.placement.options import PlaceOptions
from xflow.placement.place import place, training_curve_png
from xflow.placement.simulator import INFEASIBLE_SECONDS, SimParams
from xflow.placement.topology import load_topology
from xflow.placement.train import TrainOptions
from xflow.placement.transfer import train_across

SIM_TOPOLOGIES = ("4xgpu-pcie", "2xgpu-memcap", "8xgpu-nvlink")
HEURISTICS = ("round-robin", "min-cut", "m-etf")


def cost_model(kind: str, cost_db: str | None = None):  # noqa: ANN201
    """Node costs: measured with ONNX Runtime through the SQLite cache (the default a user gets), or analytic."""
    if kind == "analytic":
        return AnalyticCost()
    from xflow.cost.cache import CostCache
    from xflow.cost.measured import MeasuredCost

    return MeasuredCost(cache=CostCache(cost_db))


def clock_of(args) -> Callable[[], float]:  # noqa: ANN001
    """What planning time limits are read on: wall time (what a user gets), or this process's CPU time, so
    that on a shared machine a run paused or starved by other work still gets its full budget of computing."""
    return time.process_time if args.clock == "cpu" else time.perf_counter


def ms(seconds: float) -> str:
    return "infeasible" if seconds >= INFEASIBLE_SECONDS else f"{seconds * 1e3:.2f}"


def bench_graphs(args) -> dict:  # noqa: ANN001
    """The zoo models asked for, then every --onnx file (exported models), by name."""
    graphs = {name: (lambda n=name: graph_from_model(zoo.build(n, small=args.small)))
              for name in args.models.split(",") if name}
    for path in args.onnx:
        graphs[os.path.splitext(os.path.basename(path))[0]] = lambda p=path: load(p)
    return graphs


def run_sim(graphs: dict, topologies: list[str], args, out: str) -> list[dict]:  # noqa: ANN001
    """Per model and simulated topology: every baseline, then RL trained from a fresh policy and/or warm-started
    from the fastest baseline (``--starts``), each with the improvement pass from every candidate, within the
    planning time limit. One row per (model, topology) with every figure."""
    rows = []
    costs = cost_model(args.cost, args.cost_db)
    for name, build in graphs.items():
        graph = build()
        for topo_name in topologies:
            topo = load_topology(topo_name)
            row: dict = {"model": name, "topology": topo_name}
            for start in args.starts.split(","):
                options = PlaceOptions(time_limit=args.time_limit, warm_start=start == "warm",
                                       train=TrainOptions(seed=args.seed, clock=clock_of(args)))
                outcome = place(graph, costs, topo, options, name)
                plan = outcome.plan
                row.update(nodes=plan.extra["nodes"], groups=plan.rl["groups"], baselines=plan.baselines,
                           cost_seconds=outcome.cost_seconds)
                row[start] = {"rl": plan.rl["seconds"],
                              "rl_improved": plan.rl.get("improved_seconds", plan.rl["seconds"]),
                              "plan": plan.seconds, "chosen": plan.chosen, "planning_seconds": outcome.seconds,
                              **{k: plan.rl.get(k) for k in ("improved_from", "steps", "evaluations", "warm_start",
                                                             "imitation_steps")}}
                best_heuristic = min(plan.baselines[k] for k in HEURISTICS)
                print(f"{name:13s} {topo_name:13s} {start:5s} best heuristic {ms(best_heuristic)} ms, "
                      f"RL {ms(row[start]['rl'])}, RL+improve {ms(row[start]['rl_improved'])}, plan "
                      f"{ms(plan.seconds)} ({plan.chosen}), planning {outcome.seconds:.1f} s", flush=True)
                if outcome.curve and start == "fresh":
                    training_curve_png(outcome.curve, os.path.join(out, f"curve_{name}_{topo_name}.png"),
                                       f"{name} on {topo_name}")
            rows.append(row)
            _dump(out, f"sim_{args.cost}.json", rows)
    return rows


def transfer_policy(graphs: dict, topo, seed: int, args, costs):  # noqa: ANN001, ANN201
    """The policy trained across ``graphs`` with ``seed``: read from --policy-dir when a file trained with the
    same settings is there (training has no time limit, so a seed gives the same policy anywhere), else
    trained and written there. Returns (policy, training seconds; 0 when read)."""
    from xflow.placement.policy import Policy

    meta = {"seed": seed, "steps": args.transfer_steps, "train_on": list(graphs), "topology": topo.name,
            "cost": args.cost}
    if args.transfer_hint:  # policies written before hints existed have no key, and read nothing
        meta["hint"] = args.transfer_hint
    if args.transfer_decoder:  # nor before decoders
        meta["decoder"] = args.transfer_decoder
    path = os.path.join(args.policy_dir, f"transfer_{topo.name}_seed{seed}.npz") if args.policy_dir else ""
    if path and os.path.exists(path):
        policy, saved = Policy.load(path)
        if saved == meta:
            return policy, 0.0
    started = time.perf_counter()
    options = PlaceOptions(train=TrainOptions(seed=seed), transfer_steps=args.transfer_steps,
                           transfer_hint=args.transfer_hint, transfer_decoder=args.transfer_decoder)
    policy, _ = train_across(graphs, topo, options, costs)
    if path:
        os.makedirs(args.policy_dir, exist_ok=True)
        policy.save(path, meta)
    return policy, time.perf_counter() - started


def run_transfer(args, out: str) -> list[dict]:  # noqa: ANN001
    """Per seed: one policy trained on part of the zoo (``--train-on``, a fixed number of steps) places each
    held-out model zero-shot, compared with RL trained on that model alone for the time limit (the policies'
    own placements, no improvement pass). Then the plans a user gets: per-graph planning (the default: warm
    start, improvement pass from every candidate) for the time limit, against the transferred policy
    fine-tuned on the model with the same pipeline for a quarter of that time."""
    train_names = args.train_on.split(",")
    held_out = [m for m in (args.held_out.split(",") if args.held_out else zoo.MODELS) if m not in train_names]
    topo = load_topology(args.transfer_topology)
    costs = cost_model(args.cost, args.cost_db)
    graphs = {n: graph_from_model(zoo.build(n, small=args.small)) for n in train_names}
    tests = {n: graph_from_model(zoo.build(n, small=args.small)) for n in held_out}
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        policy, train_seconds = transfer_policy(graphs, topo, seed, args, costs)
        settings = TrainOptions(seed=seed, clock=clock_of(args))
        for name, graph in tests.items():
            cpu: dict[str, float] = {}  # CPU seconds of each run: far below its wall time = the process waited
            with cpu_clock(cpu, "zero_shot"):
                zero = place(graph, costs, topo, PlaceOptions(policy=policy, improve_sweeps=0, time_limit=0,
                                                              zero_shot_samples=args.zero_shot_samples,
                                                              zero_shot_temperature=args.zero_shot_temperature), name)
            with cpu_clock(cpu, "per_model"):
                own = place(graph, costs, topo, PlaceOptions(improve_sweeps=0, time_limit=args.time_limit,
                                                             warm_start=False, train=settings), name)
            with cpu_clock(cpu, "per_graph"):
                per_graph = place(graph, costs, topo, PlaceOptions(time_limit=args.time_limit,
                                                                   train=settings), name)
            with cpu_clock(cpu, "fine_tune"):
                tuned = place(graph, costs, topo, PlaceOptions(policy=policy, fine_tune=True,
                                                               time_limit=args.time_limit / 4,
                                                               train=settings), name)
            per_model, zero_s = own.plan.rl["seconds"], zero.plan.rl["seconds"]
            greedy = zero.plan.rl["greedy_seconds"]
            row = {"model": name, "seed": seed, "topology": topo.name, "zero_shot": zero_s,
                   "zero_shot_greedy": greedy, "greedy_gap": greedy / per_model - 1,
                   "zero_shot_seconds": zero.seconds, "per_model": per_model, "per_model_seconds": own.seconds,
                   "gap": zero_s / per_model - 1,
                   "per_graph_plan": per_graph.plan.seconds, "per_graph_chosen": per_graph.plan.chosen,
                   "per_graph_seconds": per_graph.seconds,
                   "fine_tuned_rl": tuned.plan.rl["seconds"], "fine_tuned_plan": tuned.plan.seconds,
                   "fine_tuned_chosen": tuned.plan.chosen, "fine_tune_seconds": tuned.seconds,
                   "fine_tune_steps": tuned.plan.rl["steps"], "fine_tune_start": tuned.plan.rl["warm_start"],
                   "fine_tune_gap": tuned.plan.seconds / per_graph.plan.seconds - 1,
                   "best_heuristic": min(own.plan.baselines[k] for k in HEURISTICS), "trained_on": train_names,
                   "zero_shot_samples": args.zero_shot_samples, "zero_shot_temperature": zero.plan.rl["temperature"],
                   "transfer_steps": args.transfer_steps, "train_seconds": train_seconds,
                   "transfer_hint": args.transfer_hint, "transfer_decoder": args.transfer_decoder,
                   "fine_tune_evaluations": tuned.plan.rl["evaluations"],
                   "fine_tune_train_seconds": tuned.plan.rl["train_seconds"],
                   "fine_tune_improved_from": tuned.plan.rl.get("improved_from"),
                   "fine_tune_improve_seconds": tuned.plan.rl.get("improve_seconds"),
                   "per_graph_improved_from": per_graph.plan.rl.get("improved_from"),
                   "per_graph_improve_seconds": per_graph.plan.rl.get("improve_seconds"),
                   "per_graph_steps": per_graph.plan.rl["steps"],
                   "per_graph_evaluations": per_graph.plan.rl["evaluations"],
                   **{f"{k}_cpu_seconds": v for k, v in cpu.items()}}
            rows.append(row)
            print(f"seed {seed} {name:13s} zero-shot {ms(zero_s)} ms (greedy decode {ms(greedy)}) vs per-model RL "
                  f"{ms(per_model)} ms: gap {row['gap'] * 100:+.1f}% (greedy {row['greedy_gap'] * 100:+.1f}%); plan: "
                  f"per-graph {ms(per_graph.plan.seconds)} ms "
                  f"({per_graph.plan.chosen}, {per_graph.seconds:.0f} s), fine-tuned {ms(tuned.plan.seconds)} ms "
                  f"({tuned.plan.chosen}, {tuned.seconds:.0f} s): {row['fine_tune_gap'] * 100:+.1f}%; CPU s "
                  f"{', '.join(f'{k} {v:.0f}' for k, v in cpu.items())}", flush=True)
            _dump(out, f"transfer_{args.cost}.json", rows)
    return rows


@contextmanager
def cpu_clock(into: dict[str, float], key: str) -> Iterator[None]:
    """Store the CPU seconds this process spends inside the block under ``into[key]``: on a shared machine
    a time-limited run whose CPU time is far below its wall time was paused or starved, not slow."""
    started = time.process_time()
    try:
        yield
    finally:
        into[key] = round(time.process_time() - started, 3)


def run_real(args, out: str) -> dict:  # noqa: ANN001
    """Calibrate and validate the simulator on the real CPU executor (topology `cpu`: two CPU devices of
    half the cores each), then plan with the calibrated simulator and measure every baseline's plan and
    the chosen one for real."""
    from xflow.placement.baselines import all_baselines
    from xflow.placement.executor import Executor
    from xflow.placement.groups import make_groups
    from xflow.placement.problem import build_problem
    from xflow.placement.simulator import Simulator

    topo = load_topology("cpu")
    costs = cost_model(args.cost, args.cost_db)
    result: dict = {"validation": [], "measured": []}
    for name in args.real_models.split(","):
        graph = graph_from_model(zoo.build(name, small=True))
        report = validate_simulator(graph, topo, costs, placements=args.placements, runs=args.runs, seed=args.seed,
                                    fit_placements=args.fit_placements, rounds=args.rounds)
        report["model"] = name
        result["validation"].append(report)
        print(f"calibration {name:13s} tau {report['tau_uncalibrated']:.3f} uncalibrated -> {report['tau']:.3f} "
              f"calibrated over {report['placements']} held-out random placements "
              f"(log RMSE {report['log_rmse_validation']:.3f}); measurements' split-half tau "
              f"{report['tau_measurement_split_half']:.3f}", flush=True)
        params = SimParams(**report["params"])
        options = PlaceOptions(sim_params=params, time_limit=args.time_limit,
                               train=TrainOptions(seed=args.seed, clock=clock_of(args)))
        outcome = place(graph, costs, topo, options, name)
        plan = outcome.plan
        problem = build_problem(graph, costs, name)
        plans = all_baselines(make_groups(problem, topo), Simulator(problem, topo, params))
        plans[f"plan ({plan.chosen})"] = plan.devices_for(problem)
        executor = Executor(problem, topo, runs=args.runs, seed=args.seed)
        try:
            timed = executor.measure_interleaved(list(plans.values()), args.rounds, args.seed)
            measured = {k: m.seconds for k, m in zip(plans, timed, strict=True)}
        finally:
            executor.close()
        result["measured"].append({"model": name, "chosen": plan.chosen, "measured": measured,
                                   "simulated": {**plan.baselines, "plan": plan.seconds}})
        print(f"measured   {name:13s} " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in measured.items()), flush=True)
        _dump(out, f"real_{args.cost}.json", result)
    return result


def _dump(out: str, name: str, data: object) -> None:
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)


def best_single(row: dict) -> float:
    return min(v for k, v in row["baselines"].items() if k.startswith("single:"))


def sim_chart(rows: list[dict], path: str) -> None:
    """Bars: each method's step time relative to the best heuristic, per model, one panel per topology."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    topologies = list(dict.fromkeys(r["topology"] for r in rows))
    starts = [s for s in ("fresh", "warm") if s in rows[0]]
    methods = ["best single", *HEURISTICS, *(f"{s} {m}" for s in starts for m in ("rl", "plan"))]
    fig, axes = plt.subplots(len(topologies), 1, figsize=(10, 3 * len(topologies)), squeeze=False)
    width = 0.8 / len(methods)
    for ax, topo in zip(axes[:, 0], topologies, strict=True):
        sub = [r for r in rows if r["topology"] == topo]
        x = np.arange(len(sub))
        for i, method in enumerate(methods):
            values = []
            for r in sub:
                start, _, kind = method.partition(" ")
                v = best_single(r) if method == "best single" else r[start][kind] if kind else r["baselines"][method]
                values.append(min(v / min(r["baselines"][k] for k in HEURISTICS), 3.0))
            ax.bar(x + i * width, values, width, label=method)
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set_xticks(x + 0.4, [r["model"] for r in sub])
        ax.set_ylabel("time / best heuristic")
        ax.set_title(f"{topo} (simulated)")
    axes[0, 0].legend(ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def markdown(rows: list[dict], transfer: list[dict]) -> str:
    """The tables of the lab note: step times in ms (simulated), ratios to the best heuristic."""
    lines: list[str] = []
    if rows:
        starts = [s for s in ("fresh", "warm") if s in rows[0]]
        head = ["model", "topology", "groups", "best single", *HEURISTICS]
        for s in starts:
            head += [f"RL {s}", f"RL+improve {s}", f"plan {s}", f"plan {s} / best heuristic", f"planning s {s}"]
        lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for r in rows:
            heuristic = min(r["baselines"][k] for k in HEURISTICS)
            cells = [r["model"], r["topology"], str(r["groups"]), ms(best_single(r)),
                     *(ms(r["baselines"][k]) for k in HEURISTICS)]
            for s in starts:
                e = r[s]
                cells += [ms(e["rl"]), ms(e["rl_improved"]), f"{ms(e['plan'])} ({e['chosen']})",
                          f"{e['plan'] / heuristic:.3f}", f"{e['planning_seconds']:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
    if transfer:
        lines += [""] * bool(lines)
        lines += ["| held-out model | seed | zero-shot ms (best of samples) | greedy decode ms | per-model RL ms | "
                  "gap | greedy gap | per-graph plan ms | fine-tuned plan ms (1/4 time) | fine-tune gap | "
                  "fine-tune start | best heuristic ms |",
                  "|" + " --- |" * 12]
        lines += [f"| {t['model']} | {t['seed']} | {ms(t['zero_shot'])} | {ms(t['zero_shot_greedy'])} | "
                  f"{ms(t['per_model'])} | {t['gap'] * 100:+.1f}% | {t['greedy_gap'] * 100:+.1f}% | "
                  f"{ms(t['per_graph_plan'])} ({t['per_graph_chosen']}) | "
                  f"{ms(t['fine_tuned_plan'])} ({t['fine_tuned_chosen']}) | {t['fine_tune_gap'] * 100:+.1f}% | "
                  f"{t['fine_tune_start']} | {ms(t['best_heuristic'])} |" for t in transfer]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["all", "sim", "transfer", "real"], default="all")
    parser.add_argument("--models", default=",".join(zoo.MODELS), help="zoo models (comma-separated; '' for none)")
    parser.add_argument("--onnx", nargs="*", default=[], metavar="FILE", help="exported models to add to the sim part")
    parser.add_argument("--topologies", default=",".join(SIM_TOPOLOGIES))
    parser.add_argument("--cost", choices=["analytic", "measured"], default="measured",
                        help="node costs: measured with ONNX Runtime through the SQLite cache (what a user gets)")
    parser.add_argument("--cost-db", default=None, help="SQLite cache of measured costs (default: the user's)")
    parser.add_argument("--small", action="store_true", help="small zoo variants (quick check)")
    parser.add_argument("--time-limit", type=float, default=PlaceOptions.time_limit,
                        help="planning time limit per model and topology (s)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="read --time-limit on wall time (a user's) or on this process's CPU time (a shared "
                             "machine: time paused or waiting for a core is not counted)")
    parser.add_argument("--starts", default="fresh,warm",
                        help="RL from a fresh policy, warm-started from the fastest baseline (imitation), or both")
    parser.add_argument("--train-on", default="resnet50,squeezenet,bert,nasrnn")
    parser.add_argument("--held-out", default="",
                        help="transfer: the held-out models to place (comma-separated; default every zoo model "
                             "not in --train-on)")
    parser.add_argument("--transfer-topology", default="4xgpu-pcie")
    parser.add_argument("--transfer-steps", type=int, default=PlaceOptions.transfer_steps,
                        help="training steps of the transfer policy (no time limit)")
    parser.add_argument("--transfer-hint", default=PlaceOptions.transfer_hint,
                        help="transfer: what the policy reads besides the graph ('' nothing, 'fastest-baseline')")
    parser.add_argument("--transfer-decoder", default=PlaceOptions.transfer_decoder,
                        help="transfer: how the policy draws a placement ('' every group independently, 'schedule' "
                             "group by group reading the partial schedule)")
    parser.add_argument("--seeds", type=int, default=3, help="transfer: seeds (one policy each)")
    parser.add_argument("--first-seed", type=int, default=0, help="transfer: the first of --seeds seeds")
    parser.add_argument("--policy-dir", default="",
                        help="transfer: read the trained policies from here when trained with the same settings, "
                             "else write them here")
    parser.add_argument("--zero-shot-samples", type=int, default=PlaceOptions.zero_shot_samples,
                        help="placements sampled from the policy; the fastest in the simulator is kept")
    parser.add_argument("--zero-shot-temperature", type=float, default=PlaceOptions.zero_shot_temperature,
                        help="temperature the zero-shot samples are drawn at (0: the policy's own, 1.0 for a schedule "
                             "decoder, 0.3 for an independent policy)")
    parser.add_argument("--real-models", default=",".join(zoo.MODELS),
                        help="real: small zoo models to calibrate on (every one the CPU executor can split)")
    parser.add_argument("--placements", type=int, default=12, help="real: placements tau is computed over")
    parser.add_argument("--fit-placements", type=int, default=12, help="real: random placements to fit on")
    parser.add_argument("--runs", type=int, default=5, help="real: timed runs per placement and round")
    parser.add_argument("--rounds", type=int, default=20, help="real: interleaved rounds of every placement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default="benchmarks/placement_results")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, f"machine_{args.part}_{args.cost}.json"), "w", encoding="utf-8") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "machine": platform.platform(),
                   "args": vars(args)}, f, indent=2)
    rows: list[dict] = []
    transfer: list[dict] = []
    if args.part in ("all", "sim"):
        rows = run_sim(bench_graphs(args), args.topologies.split(","), args, args.out_dir)
        sim_chart(rows, os.path.join(args.out_dir, f"placement_sim_{args.cost}.png"))
    if args.part in ("all", "transfer"):
        transfer = run_transfer(args, args.out_dir)
    if args.part in ("all", "real"):
        run_real(args, args.out_dir)
    if rows or transfer:
        with open(os.path.join(args.out_dir, f"{args.part}_{args.cost}.md"), "w", encoding="utf-8") as f:
            f.write(markdown(rows, transfer))


if __name__ == "__main__":
    main()

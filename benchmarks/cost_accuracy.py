"""How close a graph's summed measured costs come to its measured end-to-end latency, per zoo model.

    .venv/bin/python benchmarks/cost_accuracy.py [MODEL ...]

For each zoo model (full size): the sum of its nodes' costs each measured alone, the sum of its group
costs (a head and the epilogues ORT fuses into it measured as one subgraph, see xflow/cost/fusion.py),
and the median of 20 runs of the whole model, all with the same ORT settings as ``xflow optimize``
(fresh cost cache in a temporary folder). Prints a markdown table for docs/RESULTS.md.
"""

from __future__ import annotations

import os
import sys
import tempfile

from xflow import zoo
from xflow.cost import GraphCoster
from xflow.cost.cache import CostCache
from xflow.cost.measured import MeasuredCost
from xflow.onnx_io import graph_from_model
from xflow.ort import open_session
from xflow.runtime import median_latency, random_feeds

DEFAULT_MODELS = ["resnet50", "resnext50", "inception_v3", "squeezenet", "bert", "nasnet_a", "nasrnn"]


def main(models: list[str]) -> None:
    """Print one row per model: isolated-node sum, group sum, measured latency (ms)."""
    print("| model | isolated nodes (ms) | groups (ms) | measured end to end (ms) |")
    print("| --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory(prefix="xflow-cost-accuracy-") as folder:
        for name in models:
            model = zoo.build(name)
            graph = graph_from_model(model)
            cache = CostCache(os.path.join(folder, f"{name}.sqlite"))
            grouped = GraphCoster(MeasuredCost(cache=cache)).cost(graph)
            isolated = sum(MeasuredCost(cache=cache).node_costs(graph, graph.nodes))
            session = open_session(model.SerializeToString())
            latency = median_latency(session, random_feeds(session, 0), runs=20)
            print(f"| {name} | {isolated * 1e3:.1f} | {grouped * 1e3:.1f} | {latency * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT_MODELS)

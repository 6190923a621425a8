"""``optimize``'s entry points. The chain of passes, over in-memory graphs and models:

load -> search -> finalize -> select -> verify -> place (optional) -> write.

Each pass takes what the previous ones returned and reports its own figures; ``report.assemble`` builds the
report from them (``chain.run_passes`` runs the passes before write). Models go to ONNX Runtime from memory
(``xflow.ort.graphs`` writes a file in the run's scratch folder only for models whose weights are external or
too large for one protobuf), and nothing is written until every pass before write has succeeded.
``optimize_file`` is what ``xflow optimize`` runs; ``optimize_model`` (and ``xflow.optimize``) runs the same
chain on a ModelProto and returns one."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import onnx

from xflow.check.certificate import Derived, carry, certify, read_certificate, rule_matches
from xflow.check.check import input_settings
from xflow.check.replay import Replayed, StepRefused, replay, rules_for
from xflow.cost.base import CostModel
from xflow.errors import XflowError
from xflow.files import check_output_file, run_folder, write_json
from xflow.onnx_io import would_overwrite
from xflow.optimize import load, report, write
from xflow.optimize.chain import run_passes
from xflow.optimize.finalize import Finalist
from xflow.optimize.options import OptimizeOptions
from xflow.optimize.place import PlaceRequest
from xflow.ort.graphs import fits_in_memory
from xflow.search import SearchReport


def optimize_file(in_path: str, out_path: str, options: OptimizeOptions, cost_model: CostModel | None = None,
                  say: Callable[[str], None] = print,
                  progress: Callable[[SearchReport], None] | None = None,
                  place_request: PlaceRequest | None = None) -> report.OptimizeReport:
    """Optimize ``in_path`` into ``out_path``; the written model is verified equal and never slower
    (unless ``keep_if_slower``). Raises XflowError for bad input; writes nothing on failure."""
    started = time.perf_counter()
    write.check_output_path(in_path, out_path)
    if place_request is not None:
        check_output_file(place_request.plan_path, "plan output")
    source = load.load_source(in_path, options.inputs)
    clash = would_overwrite(source.graph, out_path)
    if clash is not None:
        raise XflowError(out_path, f"writing it would replace {clash}, which holds the input's weights; "
                                   "choose another output path")
    with run_folder(out_path) as scratch:
        run = run_passes(source, out_path, options, cost_model, options.runtime.sessions(scratch), say, progress,
                         place_request)
        chosen = run.chosen.graph if run.chosen is not None else None
        certificate = _certificate(source, run.chosen, run.report.rules_file, options)
        written = write.write(source, chosen, out_path, scratch, certificate, options.output.certificate_path)
        if run.placement is not None and place_request is not None:
            write_json(place_request.plan_path, run.placement.plan.to_json(), scratch)
            if place_request.show is not None:
                place_request.show(run.placement.plan)
    return report.finish(run.report, written, started)


def _certificate(source: load.Source, chosen: Finalist | None, rules_file: str, options: OptimizeOptions
                 ) -> dict[str, Any] | None:
    """The certificate of the graph chosen (None: nothing rewritten, or none asked for)."""
    if chosen is None or not options.output.certificate:
        return None
    assert chosen.unfolded is not None and chosen.folded is not None  # finalize's finalists know them
    derived = Derived(chosen.unfolded, chosen.folded, chosen.simplified)
    return certify(source.graph, rule_matches(chosen.steps), rules_file, derived, options.inputs.shapes)


def replay_file(in_path: str, out_path: str, options: OptimizeOptions) -> Replayed:
    """``xflow optimize --replay CERT``: the steps of the certificate ``options.output.replay`` applied to
    ``in_path`` (each re-established as ``xflow check`` does; the rules trusted by content hash) and the result
    written with that certificate, without searching or measuring: the bytes the run that made it wrote."""
    assert options.output.replay is not None
    write.check_output_path(in_path, out_path)
    certificate = read_certificate(options.output.replay)
    rules = rules_for(certificate, options.rules_path)
    source = load.load_source(in_path, input_settings(certificate))
    clash = would_overwrite(source.graph, out_path)
    if clash is not None:
        raise XflowError(out_path, f"writing it would replace {clash}, which holds the input's weights; "
                                   "choose another output path")
    try:
        replayed = replay(source.graph, certificate, rules)
    except StepRefused as refused:
        raise XflowError(options.output.replay, f"does not replay on {in_path}: {refused}") from None
    with run_folder(out_path) as scratch:
        write.write(source, replayed.graph, out_path, scratch, certificate if options.output.certificate else None,
                    options.output.certificate_path)
    return replayed


def optimize_model(model: onnx.ModelProto | str, options: OptimizeOptions, cost_model: CostModel | None = None
                   ) -> tuple[onnx.ModelProto, report.OptimizeReport]:
    """Optimize a model in memory (or a file) and return the result with its report: the same checks
    as ``optimize_file`` (verified; the original comes back when the optimized one is not faster).
    Scratch files, needed only for models with external or very large weights, go in a run folder under
    the system's temp directory."""
    started = time.perf_counter()
    source = load.load_source(model, options.inputs)
    with _api_scratch() as scratch:
        run = run_passes(source, "<ModelProto>", options, cost_model, options.runtime.sessions(scratch),
                         lambda _m: None, None, None)
    if run.chosen is None:  # the original itself (given, or parsed from its file with its weights)
        result = source.proto if source.proto is not None else onnx.load(source.label)
        kept = write.Written(graph=None, nodes=len(result.graph.node), copied=True)
        return result, report.finish(run.report, kept, started)
    chosen = run.chosen
    result = chosen.proto  # made once: the sessions of select and verify read its bytes
    carry(result, _certificate(source, chosen, run.report.rules_file, options))
    if not fits_in_memory(chosen.graph):  # weights read in from their files: the model stands on its own
        onnx.load_external_data_for_model(result, chosen.graph.context.base_dir if chosen.graph.context else "")
    written = write.Written(graph=chosen.graph, modified=True, nodes=len(result.graph.node), copied=False)
    return result, report.finish(run.report, written, started)


@contextlib.contextmanager
def _api_scratch() -> Iterator[str]:
    with run_folder(os.path.join(tempfile.gettempdir(), "xflow")) as scratch:
        yield scratch


def optimize(model: onnx.ModelProto | str, **options: Any) -> onnx.ModelProto:
    """Optimize an ONNX model (a ModelProto or a path) and return the optimized ModelProto.

    Keyword options are the flat names of ``OptimizeOptions.of`` (``rules_path``, ``alpha``, ``budget``,
    ``branches``, ``time_limit``, ``provider``, ``threads``, ``cost``, ``cost_db``, ``input_shapes``,
    ``shape_profile`` (``{"batch": (1, 8)}``: sizes of a dynamic dim, see ``xflow.onnx_io.shape_profile``),
    ``seed``, ``keep_if_slower``, ...). Raises XflowError (EquivalenceError on a mismatch) as the CLI would."""
    return optimize_model(model, OptimizeOptions.of(**options))[0]

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
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import onnx

from xflow.check.certificate import Derived, carry, certify, read_certificate, rule_matches
from xflow.check.check import input_settings
from xflow.check.replay import Replayed, StepRefused, replay, rules_for
from xflow.cost.base import CostModel
from xflow.errors import XflowError
from xflow.files import (
    all_or_none,
    check_distinct,
    check_output_file,
    keep_private,
    run_folder,
    same_folder,
    write_json,
    write_text,
)
from xflow.onnx_io import would_overwrite
from xflow.onnx_io.save import weight_files
from xflow.optimize import load, report, write
from xflow.optimize.chain import run_passes
from xflow.optimize.finalize import Finalist
from xflow.optimize.options import OptimizeOptions
from xflow.optimize.place import PlaceRequest
from xflow.optimize.progress import Progress, enter
from xflow.ort.graphs import fits_in_memory

#: The library's messages (what a run noticed and did besides its report): the CLI shows them (``-v`` / ``-q``).
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PageRequest:
    """A page made of the run (``--html``): where it goes, and how it is made from the finished report and the
    certificate the written model carries (None: none); written with the run's other outputs, all or none."""

    path: str
    render: Callable[[report.OptimizeReport, Mapping[str, Any] | None], str]


def optimize_file(in_path: str, out_path: str, options: OptimizeOptions, cost_model: CostModel | None = None,
                  say: Callable[[str], None] = _log.info,
                  progress: Progress | None = None,
                  place_request: PlaceRequest | None = None, report_path: str | None = None,
                  page: PageRequest | None = None) -> report.OptimizeReport:
    """Optimize ``in_path`` into ``out_path`` (and write the report to ``report_path``, when given); the written
    model is verified equal and never slower (unless ``keep_if_slower``). What the run notices goes to ``say`` (by
    default the ``xflow.optimize.run`` logger, at INFO); ``progress`` is told each phase as it starts. Raises
    XflowError for bad input; writes nothing on failure: every output, or none. ``page``: a page of the run written
    with the other outputs (``--html``)."""
    started = time.perf_counter()
    write.check_output_path(in_path, out_path)
    plan_path = place_request.plan_path if place_request is not None else None
    files = run_files(in_path, out_path, options, plan_path, report_path, page.path if page is not None else None)
    check_distinct(files)
    if place_request is not None:
        check_output_file(place_request.plan_path, "plan output")
    source = load.load_source(in_path, options.inputs)
    clash = would_overwrite(source.graph, out_path)
    if clash is not None:
        raise XflowError(out_path, f"writing it would replace {clash}, which holds the input's weights; "
                                   "choose another output path")
    weights = {f"IN.onnx's weights file {os.path.basename(f)}": f for f in weight_files(source.graph)}
    check_distinct({**files, **weights})
    with run_folder(out_path) as scratch:
        run = run_passes(source, out_path, options, cost_model, options.runtime.sessions(scratch), say, progress,
                         place_request)
        chosen = run.chosen.graph if run.chosen is not None else None
        if run.chosen is not None and options.output.certificate:
            enter(progress, "certify")
        certificate = _certificate(source, run.chosen, run.report.rules_file, options)
        certificate_path = options.output.certificate_path
        page_path = page.path if page is not None else None
        outputs = [out_path, f"{out_path}.data",
                   *(p for p in (plan_path, report_path, certificate_path, page_path) if p)]
        enter(progress, "write")
        with all_or_none(outputs, scratch):  # a report into a full disk takes the model back out
            written = write.write(source, chosen, out_path, scratch, certificate, certificate_path)
            keep_private(in_path, [out_path, f"{out_path}.data"])
            if run.placement is not None and place_request is not None:
                write_json(place_request.plan_path, run.placement.plan.to_json(), scratch)
            finished = report.finish(run.report, written, started)
            if report_path:
                write_json(report_path, finished.to_json(), scratch if same_folder(report_path, out_path) else None)
            if page is not None:
                write_text(page.path, page.render(finished, certificate),
                           scratch if same_folder(page.path, out_path) else None)
        if run.placement is not None and place_request is not None and place_request.show is not None:
            place_request.show(run.placement.plan)
    return finished


def _certificate(source: load.Source, chosen: Finalist | None, rules_file: str, options: OptimizeOptions
                 ) -> dict[str, Any] | None:
    """The certificate of the graph chosen (None: nothing rewritten, none asked for, or none could be stated).

    A derivation that does not replay is a fault of xflow's certifier, not of the model (which was checked
    numerically like every written model): the model is written without a certificate, and the run says so."""
    if chosen is None or not options.output.certificate:
        return None
    assert chosen.unfolded is not None and chosen.folded is not None  # finalize's finalists know them
    derived = Derived(chosen.unfolded, chosen.folded, chosen.simplified, chosen.shaped, chosen.evaluated,
                      chosen.shared)
    try:
        return certify(source.graph, rule_matches(chosen.steps), rules_file, derived, options.inputs.shapes)
    except XflowError as exc:
        _log.warning("%s; the model is written without a certificate, so `xflow check` cannot check it", exc.problem)
        return None


def replay_file(in_path: str, out_path: str, options: OptimizeOptions) -> Replayed:
    """``xflow optimize --replay CERT``: the steps of the certificate ``options.output.replay`` applied to
    ``in_path`` (each re-established as ``xflow check`` does; the rules trusted by content hash) and the result
    written with that certificate, without searching or measuring: the bytes the run that made it wrote."""
    assert options.output.replay is not None
    write.check_output_path(in_path, out_path)
    check_distinct(run_files(in_path, out_path, options))
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


def run_files(in_path: str, out_path: str, options: OptimizeOptions, plan_path: str | None = None,
              report_path: str | None = None, page_path: str | None = None) -> dict[str, str | None]:
    """Every file one optimize run reads or writes, by the role the user gave it (``check_distinct``)."""
    return {"IN.onnx": in_path, "OUT.onnx": out_path, "OUT.onnx's data file": f"{out_path}.data",
            "--rules": options.rules_path, "--inputs": options.inputs.npz, "--cost-db": options.cost.db,
            "the plan file (--place)": plan_path, "--report": report_path, "--html": page_path,
            "--certificate": options.output.certificate_path, "--replay": options.output.replay}


def optimize_model(model: onnx.ModelProto | bytes | str, options: OptimizeOptions, cost_model: CostModel | None = None
                   ) -> tuple[onnx.ModelProto, report.OptimizeReport]:
    """Optimize a model in memory (or a file) and return the result with its report: the same checks
    as ``optimize_file`` (verified; the original comes back when the optimized one is not faster).
    Scratch files, needed only for models with external or very large weights, go in a run folder under
    the system's temp directory."""
    started = time.perf_counter()
    path = os.fspath(model) if isinstance(model, str | os.PathLike) else None
    check_distinct({"the model": path, "rules_path": options.rules_path,
                    "inputs_npz": options.inputs.npz, "cost_db": options.cost.db})
    source = load.load_source(model, options.inputs)
    with _api_scratch() as scratch:
        run = run_passes(source, "<ModelProto>", options, cost_model, options.runtime.sessions(scratch),
                         _log.info, None, None)
    if run.chosen is None:  # the original itself (given, or parsed from its file with its weights)
        result = source.proto if source.proto is not None else onnx.load(source.label)
        kept = write.Written(graph=None, nodes=len(result.graph.node), copied=True)
        return result, report.finish(run.report, kept, started)
    chosen = run.chosen
    result = chosen.proto
    carry(result, _certificate(source, chosen, run.report.rules_file, options))
    if not fits_in_memory(chosen.graph):  # weights read in from their files: the model stands on its own
        onnx.load_external_data_for_model(result, chosen.graph.context.base_dir if chosen.graph.context else "")
    written = write.Written(graph=chosen.graph, modified=True, nodes=len(result.graph.node), copied=False)
    return result, report.finish(run.report, written, started)


@contextlib.contextmanager
def _api_scratch() -> Iterator[str]:
    with run_folder(os.path.join(tempfile.gettempdir(), "xflow")) as scratch:
        yield scratch


def optimize(model: onnx.ModelProto | bytes | str, **options: Any) -> onnx.ModelProto:
    """Optimize an ONNX model (a ModelProto or a path) and return the optimized ModelProto.

    Keyword options are the flat names of ``OptimizeOptions.of`` (``rules_path``, ``alpha``, ``budget``,
    ``branches``, ``time_limit``, ``provider``, ``threads``, ``cost``, ``cost_db``, ``input_shapes``,
    ``shape_profile`` (``{"batch": (1, 8)}``: sizes of a dynamic dim, see ``xflow.onnx_io.shape_profile``),
    ``seed``, ``keep_if_slower``, ...). Raises XflowError (EquivalenceError on a mismatch) as the CLI would."""
    return optimize_model(model, OptimizeOptions.of(**options))[0]

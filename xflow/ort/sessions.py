"""The one maker of ONNX Runtime sessions in xflow, with the settings every measurement uses.

``Sessions(provider, threads, scratch)`` holds what a run's sessions share: the execution provider, the
intra-op thread count and the run's scratch folder (where a model whose weights are external or too large for
one protobuf is written for ORT to read, and where ORT writes its profiles). Stages are handed the object, not
the three values. ``xflow.ort.graphs`` makes sessions of an IR graph with it."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import onnx

from xflow import heap
from xflow.files import run_folder

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def session_options(threads: int | None = None, optimization: str = "all"):  # noqa: ANN201 - ort type
    """Session options used for every measurement: intra-op spinning off (two sessions in one
    process otherwise steal each other's cores), a fixed thread count, ORT_ENABLE_ALL."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or os.cpu_count() or 1
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
             "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
             "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[optimization]
    opts.graph_optimization_level = level
    # Fatal only: every error ORT logs also comes back as the exception xflow reports in one line
    opts.log_severity_level = 4
    return opts


@dataclass(frozen=True)
class Profiling:
    """ORT profiling of a session: where its profile goes and, optionally, where ORT saves the model it optimized
    (large initializers in ``optimized.data`` beside it)."""

    prefix: str
    optimized_path: str | None = None


@dataclass(frozen=True)
class Sessions:
    """Makes the ORT sessions of a run on ``provider`` with ``threads`` intra-op threads (None: every core);
    ``scratch`` is the run's folder for model files and profiles (None: a run folder in the temp directory,
    made when needed)."""

    provider: str = "cpu"
    threads: int | None = None
    scratch: str | None = None

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ValueError(f"unknown provider {self.provider!r}")

    @property
    def thread_count(self) -> int:
        """The intra-op threads each session runs with."""
        return self.threads or os.cpu_count() or 1

    def open(self, model: onnx.ModelProto | str | bytes, optimization: str = "all",
             config: Mapping[str, str] | None = None, profiling: Profiling | None = None,
             cpu_fallback: bool = True, arena: bool = True):  # noqa: ANN201 - ort type
        """An InferenceSession of ``model`` (a ModelProto, a path or serialized bytes) with the measurement
        settings, plus ``config`` entries; ``cpu_fallback`` False runs a CUDA session without the CPU provider;
        ``arena`` False: no CPU memory arena (a session never timed, whose run's buffers are freed after it)."""
        import onnxruntime as ort

        ort.set_default_logger_severity(4)  # the environment's own logger, which some load errors go through
        opts = session_options(self.threads, optimization)
        opts.enable_cpu_mem_arena = arena
        for key, value in (config or {}).items():
            opts.add_session_config_entry(key, value)
        if profiling is not None:
            opts.enable_profiling = True
            opts.profile_file_prefix = profiling.prefix
            if profiling.optimized_path is not None:
                opts.optimized_model_filepath = profiling.optimized_path
                opts.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                              "optimized.data")
                opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                              "1024")
        source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
        heap.trim()  # what sessions released before this one is handed back, not kept beside its weights
        providers = [PROVIDERS[self.provider]] + (["CPUExecutionProvider"]
                                                  if self.provider != "cpu" and cpu_fallback else [])
        return ort.InferenceSession(source, sess_options=opts, providers=providers)

    @contextlib.contextmanager
    def folder(self) -> Iterator[str]:
        """A fresh folder to write in, removed on exit: inside the run's scratch folder, or (none given) a run folder
        in the system's temp directory, which a later run removes if this process is killed before it does."""
        if self.scratch is not None:
            path = tempfile.mkdtemp(dir=self.scratch)
            try:
                yield path
            finally:
                shutil.rmtree(path, ignore_errors=True)
            return
        with run_folder(os.path.join(tempfile.gettempdir(), "xflow")) as folder:
            yield folder

    @staticmethod
    def inspecting(model: bytes):  # noqa: ANN205 - ort type
        """A CPU session that only reads values (shapes of an observed model): ORT's default threads, no graph
        optimizations, fatal-only logging; none of the timing settings, since nothing is timed."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 4  # fatal only: a failure here just leaves the types unknown
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def open_session(model: onnx.ModelProto | str | bytes, provider: str = "cpu", threads: int | None = None,
                 optimization: str = "all"):  # noqa: ANN201 - ort type
    """One session of ``model`` outside a run (tests, benchmarks): ``Sessions(provider, threads).open(model)``."""
    return Sessions(provider, threads).open(model, optimization)

"""ONNX Runtime sessions: ``Sessions`` is the one maker of ``InferenceSession``s in xflow (fair timing settings,
the run's scratch folder); ``xflow.ort.graphs`` makes them of IR graphs."""

from xflow.ort.sessions import PROVIDERS, Profiling, Sessions, open_session, session_options

__all__ = ["PROVIDERS", "Profiling", "Sessions", "open_session", "session_options"]

"""Test-wide settings: measured-cost caches go to a temporary folder, never the user's cache; the
hypothesis profiles the fuzz runs under."""

import os
import shutil
import tempfile

from hypothesis import settings

# "ci" (the default): the same 100 examples every run, so a failure reproduces. "nightly"
# (--hypothesis-profile=nightly): unseeded and ten times longer, new examples every run (docs/TESTING.md).
settings.register_profile("ci", derandomize=True, max_examples=100, database=None)
settings.register_profile("nightly", derandomize=False, max_examples=1000, database=None)
settings.load_profile("ci")


def _no_local_constants() -> None:
    """Hypothesis mixes literals found in every first-party module imported so far into what it draws, so
    the derandomized examples changed with test order and with any edit anywhere in the code (a test run
    alone drew other models than the same test in the suite). The fuzz must draw the same examples
    wherever it runs: draw from Hypothesis' own constants only."""
    from hypothesis.internal.conjecture import providers

    if hasattr(providers, "_get_local_constants"):  # hypothesis >= 6.131; nothing has been drawn yet
        empty = providers._local_constants
        providers._get_local_constants = lambda: empty


_no_local_constants()


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest's Config
    """Point $XDG_CACHE_HOME (inherited by subprocesses) at a fresh folder for this test run."""
    config.xflow_cache_home = tempfile.mkdtemp(prefix="xflow-test-cache-")
    config.xflow_cache_home_before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = config.xflow_cache_home


def pytest_unconfigure(config) -> None:  # noqa: ANN001 - pytest's Config
    """Remove the run's cache folder (no scratch left in /tmp) and restore $XDG_CACHE_HOME."""
    folder = getattr(config, "xflow_cache_home", None)
    if folder is None:
        return
    shutil.rmtree(folder, ignore_errors=True)
    if config.xflow_cache_home_before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = config.xflow_cache_home_before

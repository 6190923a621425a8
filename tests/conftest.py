"""Test-wide settings: measured-cost caches go to a temporary folder, never the user's cache."""

import os
import tempfile


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest's Config
    """Point $XDG_CACHE_HOME (inherited by subprocesses) at a fresh folder for this test run."""
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="xflow-test-cache-")

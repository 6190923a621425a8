"""Where the rule generator's and verifier's tasks run: this machine's processes, or a Ray cluster.

Both executors run a module-level function over a list of picklable items and yield the results, in the
items' order (``imap``) or as they finish (``imap_unordered``); the callers make the outcome independent of
the order, so the same seed gives the same rule file on either. The local one is the default; Ray is an
optional extra (``pip install 'xflow-opt[ray]'``) that spreads the same tasks over a cluster, sizes them by the
memory they declare and retries a task whose worker was lost.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from xflow.errors import XflowError

EXECUTORS = ("local", "ray")
#: How many times Ray reruns a task whose worker died (node lost, out of memory) before giving up on it.
RAY_RETRIES = 3


@dataclass(frozen=True)
class Shared:
    """A value many tasks read, put in their items once: the value itself (pickled with each item, as local
    processes need), or a reference to the one copy in Ray's object store, which each node fetches once
    instead of every task carrying its own copy. A task reads it with ``get``."""

    value: Any = None
    ref: Any = None

    def get(self) -> Any:
        """The value (fetched from Ray's object store where it lives there)."""
        if self.ref is None:
            return self.value
        import ray

        return ray.get(self.ref)


class TaskExecutor(Protocol):
    """Runs ``fn`` over items; ``share`` wraps a value many items carry; ``close`` frees its workers."""

    jobs: int

    def share(self, value: Any) -> Shared: ...

    def imap(self, fn: Callable[[Any], Any], items: Iterable[Any], memory_bytes: int = 0) -> Iterator[Any]: ...

    def imap_unordered(self, fn: Callable[[Any], Any], items: Iterable[Any], memory_bytes: int = 0,
                       failed: Callable[[Any], Any] | None = None) -> Iterator[Any]: ...

    def close(self) -> None: ...


@dataclass
class LocalTaskExecutor:
    """``jobs`` spawned worker processes on this machine, started at the first call (none when ``jobs`` is 1:
    the calls run inline)."""

    jobs: int = 1

    def __post_init__(self) -> None:
        self._started: Any = None

    @property
    def _pool(self) -> Any:
        if self._started is None and self.jobs > 1:
            self._started = multiprocessing.get_context("spawn").Pool(self.jobs)
        return self._started

    def share(self, value: Any) -> Shared:
        """``value`` as items carry it here: itself (each task's process gets a pickled copy)."""
        return Shared(value=value)

    def imap(self, fn: Callable[[Any], Any], items: Iterable[Any], memory_bytes: int = 0) -> Iterator[Any]:
        """``fn`` over ``items``, results in the items' order (``memory_bytes`` is for cluster schedulers)."""
        return self._pool.imap(fn, items) if self._pool is not None else map(fn, items)

    def imap_unordered(self, fn: Callable[[Any], Any], items: Iterable[Any], memory_bytes: int = 0,
                       failed: Callable[[Any], Any] | None = None) -> Iterator[Any]:
        """``fn`` over ``items``, results as they finish (``failed`` is for cluster executors)."""
        return self._pool.imap_unordered(fn, items) if self._pool is not None else map(fn, items)

    def close(self) -> None:
        """Stop the worker processes."""
        if self._started is not None:
            self._started.terminate()
            self._started = None


@dataclass
class RayTaskExecutor:
    """Tasks on a Ray cluster: the one at ``address`` (``auto``: the one this machine belongs to), or a local
    instance of ``jobs`` CPUs started here and stopped by ``close``."""

    jobs: int = 1
    address: str | None = None

    def __post_init__(self) -> None:
        try:
            import ray
        except ImportError:
            raise XflowError(None, "--executor ray needs Ray: pip install 'xflow-opt[ray]'") from None
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            if self.address is None:
                ray.init(num_cpus=self.jobs, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=self.address, log_to_driver=False)
        if self.address is not None:
            self.jobs = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote: dict[Callable[[Any], Any], Any] = {}

    def share(self, value: Any) -> Shared:
        """``value`` put in Ray's object store once; items carry a reference to it."""
        return Shared(ref=self._ray.put(value))

    def _submit(self, fn: Callable[[Any], Any], items: Iterable[Any], memory_bytes: int) -> list[Any]:
        if fn not in self._remote:
            self._remote[fn] = self._ray.remote(fn)
        options: dict[str, Any] = {"max_retries": RAY_RETRIES, "num_cpus": 1}
        if memory_bytes:
            options["memory"] = memory_bytes  # the scheduler places no more tasks on a node than fit its memory
        task = self._remote[fn].options(**options)
        return [task.remote(item) for item in items]

    def imap(self, fn: Callable[[Any], Any], items: Iterable[Any], memory_bytes: int = 0) -> Iterator[Any]:
        """``fn`` over ``items`` as Ray tasks, results in the items' order."""
        for ref in self._submit(fn, items, memory_bytes):
            yield self._ray.get(ref)

    def imap_unordered(self, fn: Callable[[Any], Any], items: Iterable[Any], memory_bytes: int = 0,
                       failed: Callable[[Any], Any] | None = None) -> Iterator[Any]:
        """``fn`` over ``items`` as Ray tasks, results as they finish. A task that still fails after Ray's
        retries raises, or gives ``failed(item)`` when that is given."""
        items = list(items)
        refs = self._submit(fn, items, memory_bytes)
        item_of = {ref: item for ref, item in zip(refs, items, strict=True)}
        pending = refs
        while pending:
            done, pending = self._ray.wait(pending, num_returns=1)
            try:
                yield self._ray.get(done[0])
            except self._ray.exceptions.RayError:
                if failed is None:
                    raise
                yield failed(item_of[done[0]])

    def close(self) -> None:
        """Disconnect (and stop the local instance this executor started)."""
        if self._started:
            self._ray.shutdown()


def make_task_executor(name: str, jobs: int, address: str | None = None) -> TaskExecutor:
    """The executor called ``name`` ("local" or "ray") with ``jobs`` workers."""
    if name == "ray":
        return RayTaskExecutor(jobs, address)
    if name != "local":
        raise XflowError(None, f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")
    if address is not None:
        raise XflowError(None, "--address is for --executor ray")
    return LocalTaskExecutor(jobs)

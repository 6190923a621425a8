"""A persistent cache of measured node costs in SQLite, shared safely between xflow processes.

WAL journal (readers never block the writer), one transaction per batch of inserts, a busy timeout
so two processes writing at once wait for each other instead of failing. A file that is not a
readable SQLite database (a damaged one) is moved aside and rebuilt, with a one-line warning; a file that
is plainly something else (an ONNX model, JSON, an archive, text) is refused in one line and left alone, as is
a database of a newer schema or whose ``costs`` table is not this one.

Besides node costs it keeps the run's *measured decisions* (``decisions``: which finalist timed fastest end to end,
the A/B's pairs), keyed by what decides them (``xflow.optimize.remembered``), so a later run with the same cache
reads them instead of timing again and writes the same model. Schema 2 added that table; a schema-1 file is
migrated in place when opened (the table added, its costs kept).
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from xflow.errors import XflowError
from xflow.files import check_output_file

SCHEMA_VERSION = 2  # 2: the ``decisions`` table; 1: node costs only
_SQLITE_MAGIC = b"SQLite format 3\x00"
_COSTS_COLUMNS = ("key", "seconds", "op", "env", "detail", "created")
_DECISIONS_COLUMNS = ("key", "kind", "env", "value", "created")
_CHUNK = 500  # keys per SELECT ... IN (...): below SQLite's host-parameter limit


def default_cache_path() -> Path:
    """``$XDG_CACHE_HOME/xflow/costs.sqlite``, or ``~/.cache/xflow/costs.sqlite``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "xflow" / "costs.sqlite"


def _warn_stderr(message: str) -> None:
    print(f"xflow: warning: {message}", file=sys.stderr)


class CostCache:
    """Measured node costs (seconds) by key; the key already names provider, device and ORT version."""

    def __init__(self, path: str | os.PathLike[str] | None = None,
                 warn: Callable[[str], None] = _warn_stderr) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        self.warn = warn
        self.hits = 0
        self.misses = 0
        self.rebuilt = False
        self._conn = self._open()

    # ---- opening ----------------------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        # SQLite makes a journal beside the database: a device or a kernel file system must not get one
        check_output_file(str(self.path), "cost cache")
        other = _plainly_not_a_database(self.path)
        if other is not None:
            raise XflowError(str(self.path), f"is {other}, not a cost database; name another --cost-db")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise XflowError(str(self.path), f"cannot create the cost cache folder: {exc.strerror or exc}") from None
        try:
            return self._connect()
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and not self._looks_corrupt(exc):
                raise XflowError(str(self.path), f"cannot open the cost cache: {exc}") from None
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}-{os.getpid()}")
        try:
            os.replace(self.path, aside)
            for suffix in ("-wal", "-shm"):
                side = Path(f"{self.path}{suffix}")
                if side.exists():
                    os.replace(side, f"{aside}{suffix}")
        except OSError as exc:
            raise XflowError(str(self.path), f"cost cache is corrupt and cannot be moved aside: {exc}") from None
        self.warn(f"cost cache {self.path} was not a readable database; moved it to {aside.name} and started anew")
        self.rebuilt = True
        try:
            return self._connect()
        except sqlite3.DatabaseError as exc:
            raise XflowError(str(self.path), f"cannot open the cost cache: {exc}") from None

    @staticmethod
    def _looks_corrupt(exc: sqlite3.OperationalError) -> bool:
        text = str(exc).lower()
        return "malformed" in text or "not a database" in text or "disk image" in text

    def _connect(self) -> sqlite3.Connection:
        if self.path.exists() and not os.access(self.path, os.W_OK):
            raise sqlite3.OperationalError("the file is not writable")
        if not os.access(self.path.parent, os.W_OK):
            raise sqlite3.OperationalError("the folder is not writable")
        conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 60000")
            _check_schema(conn, str(self.path))  # before anything is written to it
            _set_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute("CREATE TABLE IF NOT EXISTS costs (key TEXT PRIMARY KEY, seconds REAL NOT NULL, "
                         "op TEXT NOT NULL, env TEXT NOT NULL, detail TEXT NOT NULL, created REAL NOT NULL)")
            conn.execute("CREATE TABLE IF NOT EXISTS decisions (key TEXT PRIMARY KEY, kind TEXT NOT NULL, "
                         "env TEXT NOT NULL, value TEXT NOT NULL, created REAL NOT NULL)")
            # a schema-1 file (or a new one) is now this schema: the decisions table is the only change
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            conn.execute("COMMIT")
            conn.execute("SELECT count(*) FROM costs").fetchone()
        except (sqlite3.DatabaseError, XflowError):
            conn.close()
            raise
        return conn

    # ---- use --------------------------------------------------------------------------------------
    def get_many(self, keys: Iterable[str]) -> dict[str, float]:
        """Cached seconds for those keys that are present; counts hits and misses."""
        keys = list(dict.fromkeys(keys))
        found: dict[str, float] = {}
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start:start + _CHUNK]
            marks = ",".join("?" * len(chunk))
            found.update(self._conn.execute(f"SELECT key, seconds FROM costs WHERE key IN ({marks})", chunk))
        self.hits += len(found)
        self.misses += len(keys) - len(found)
        return found

    def put_many(self, rows: Mapping[str, tuple[float, str, str, str]]) -> None:
        """Store ``key -> (seconds, op, env, detail)`` in one transaction (a concurrent writer waits)."""
        if not rows:
            return
        now = time.time()
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.executemany("INSERT OR REPLACE INTO costs VALUES (?, ?, ?, ?, ?, ?)",
                                   [(k, s, op, env, detail, now) for k, (s, op, env, detail) in rows.items()])
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise XflowError(str(self.path), f"cannot write the cost cache: {exc}") from None

    def get_decision(self, key: str) -> str | None:
        """The measured decision stored under ``key`` (its JSON text), or None."""
        row = self._conn.execute("SELECT value FROM decisions WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def put_decision(self, key: str, kind: str, env: str, value: str) -> None:
        """Store a measured decision (JSON text) under ``key``; ``kind`` and ``env`` say what it is, for a reader."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute("INSERT OR REPLACE INTO decisions VALUES (?, ?, ?, ?, ?)",
                               (key, kind, env, value, time.time()))
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise XflowError(str(self.path), f"cannot write the cost cache: {exc}") from None

    def __len__(self) -> int:
        return int(self._conn.execute("SELECT count(*) FROM costs").fetchone()[0])

    def close(self) -> None:
        """Close the connection (the WAL is checkpointed by SQLite when the last one closes)."""
        self._conn.close()


def _check_schema(conn: sqlite3.Connection, path: str) -> None:
    """XflowError when the database is not one this code may use: a newer schema version (its rows may mean
    something else), or a ``costs`` table with other columns (another program's table of that name)."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone() if "meta" in tables else None
    try:
        version = int(row[0]) if row is not None else SCHEMA_VERSION
    except (TypeError, ValueError):
        raise XflowError(path, f"cost cache has an unreadable schema version {row[0]!r}") from None
    if version > SCHEMA_VERSION:
        raise XflowError(path, f"cost cache has schema version {version}, newer than this xflow's "
                               f"{SCHEMA_VERSION}; use a newer xflow or another --cost-db")
    for table, expected in (("costs", _COSTS_COLUMNS), ("decisions", _DECISIONS_COLUMNS)):
        columns = tuple(r[1] for r in conn.execute(f"PRAGMA table_info({table})"))
        if table in tables and columns != expected:
            raise XflowError(path, f"is not an xflow cost cache: its {table} table has columns {', '.join(columns)} "
                                   f"(expected {', '.join(expected)})")


def _plainly_not_a_database(path: Path) -> str | None:
    """What the file at ``path`` plainly is when it is something other than a SQLite database (an ONNX
    model, JSON, an archive such as .npz, text), else None: missing, empty, a database, or bytes of no
    known kind (a damaged database, which is moved aside)."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except OSError as exc:
        raise XflowError(str(path), f"cannot read the cost cache: {exc.strerror or exc}") from None
    if not head or head.startswith(_SQLITE_MAGIC):
        return None
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive (an .npz?)"
    if head.lstrip()[:1] in (b"{", b"["):
        return "a JSON file"
    if _is_onnx_model(path):
        return "an ONNX model"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return "a text file"


def _is_onnx_model(path: Path) -> bool:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - any parse failure: not a model
        return False
    return model.ir_version > 0 and (len(model.graph.node) > 0 or len(model.opset_import) > 0)


def _set_wal(conn: sqlite3.Connection, patience_s: float = 30.0) -> None:
    """Switch to WAL. SQLite answers "database is locked" at once, without its busy handler, when another
    process is switching the same new file at the same moment, so this retries for a while."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            time.sleep(0.05)

"""Writing files safely: what may be an output path, atomic writes and copies, and the per-run scratch
folder that a later run removes when the run that made it is gone.

Scratch copies of a model (finalists timed end to end, the candidate that is verified, the temporary
files of the final write) go in one folder beside the output, ``.xflow-run-<pid>-<start>``, where
``<start>`` is the process's start time (clock ticks since boot, from ``/proc``): a killed run leaves
that folder behind, and the next run writing into the same directory removes it once no live process
has that pid and start time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from xflow.errors import XflowError

#: File systems whose entries are not files (kernel interfaces, devices, pseudo terminals).
SPECIAL_FILESYSTEMS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs",
                                 "tracefs", "securityfs", "configfs", "pstore", "bpf", "mqueue",
                                 "hugetlbfs", "fusectl", "binfmt_misc", "efivarfs", "autofs", "rpc_pipefs"})
RUN_PREFIX = ".xflow-run-"
_RUN_NAME = re.compile(r"^\.xflow-run-(\d+)-(\d+)(\.[0-9a-f]+)?$")


def filesystem_type(path: str) -> str | None:
    """The type of the file system holding ``path`` (from /proc/self/mountinfo), None where unknown."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    real = os.path.realpath(path)
    best, kind = "", None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, right.split()[0]
    return kind


def check_output_file(path: str, what: str = "output") -> None:
    """Refuse an output path that is not a regular file or a name to create in a plain directory:
    devices, FIFOs, sockets and directories, and paths on /proc, /sys or /dev file systems."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # the latter: see the parent check below
        mode = None
    except OSError as exc:
        raise XflowError(path, f"cannot use as {what}: {exc.strerror or exc}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise XflowError(path, f"{what} is a directory")
    if mode is not None and not stat.S_ISREG(mode):
        kind = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
                else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise XflowError(path, f"{what} is {kind}; name a regular file")
    directory = os.path.dirname(os.path.abspath(path))
    parent = directory
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise XflowError(path, f"cannot be the {what}: {parent} is a file, not a directory")
    kind = filesystem_type(parent)
    if kind in SPECIAL_FILESYSTEMS:
        raise XflowError(path, f"{what} is on a {kind} file system, which holds no regular files; "
                               "choose another path")


def same_file(a: str, b: str) -> bool:
    """True when the two paths name one file: equal once made absolute and resolved, or the same inode
    (a hard link, a bind mount). A path that does not exist yet is the same as nothing else."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def same_folder(a: str, b: str) -> bool:
    """True when the two paths are in one directory (a temp file made beside one can be renamed onto the other)."""
    return os.path.dirname(os.path.realpath(a)) == os.path.dirname(os.path.realpath(b))


def check_distinct(roles: Mapping[str, str | None]) -> None:
    """Refuse a run that names one file in two roles (``{"--cost-db": path, "IN.onnx": path, ...}``; None: not
    given): a file a run reads or writes must never be written, moved aside or replaced by another of its
    writes. The message names the file and both roles."""
    given = [(role, path) for role, path in roles.items() if path]
    for i, (role, path) in enumerate(given):
        for other, other_path in given[:i]:
            if same_file(path, other_path):
                raise XflowError(path, f"named as both {other} and {role}; give each its own file")


def keep_private(source: str, paths: Sequence[str]) -> None:
    """Take from each written file in ``paths`` the permission bits ``source`` lacks, as ``cp`` keeps a mode:
    an output made from a private (0600) model is private too, and never more open than the umask made it."""
    try:
        allowed = stat.S_IMODE(os.stat(source).st_mode)
    except OSError:
        return
    for path in paths:
        with contextlib.suppress(OSError):
            mode = stat.S_IMODE(os.stat(path).st_mode)
            if mode & ~allowed:
                os.chmod(path, mode & allowed)


def write_atomically(path: str, write: Callable[[str], None], scratch: str | None = None) -> None:
    """``write(tmp)`` then rename onto ``path``: readers never see a partial file, and the temporary file is
    removed when writing fails or is interrupted. The temporary file is made in ``scratch`` (a run's
    folder in the same directory) or beside ``path``."""
    folder = scratch or os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.xflow-tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise XflowError(path, f"cannot write: {exc.strerror or exc}") from None
    finally:
        if os.path.exists(tmp):
            with contextlib.suppress(OSError):
                os.remove(tmp)


def write_json(path: str, data: Any, scratch: str | None = None) -> None:
    """Write ``data`` as indented JSON, atomically."""

    def dump(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)

    write_atomically(path, dump, scratch)


def write_text(path: str, text: str, scratch: str | None = None) -> None:
    """Write ``text`` (UTF-8), atomically."""

    def dump(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    write_atomically(path, dump, scratch)


def copy_atomically(source: str, path: str, scratch: str | None = None) -> None:
    """Copy ``source`` byte for byte onto ``path``, atomically."""
    write_atomically(path, lambda tmp: shutil.copyfile(source, tmp), scratch)


@contextlib.contextmanager
def all_or_none(paths: Sequence[str], scratch: str) -> Iterator[None]:
    """Inside, the files at ``paths`` may be written; when the block raises, each is put back as it was before
    (a previous file from a hard link kept in ``scratch``, a new one removed), so a run writes every output or
    none. ``scratch`` must be on the file system of every path that exists (a run's folder beside them)."""
    kept: dict[str, str | None] = {}
    for path in dict.fromkeys(paths):
        if os.path.lexists(path):
            backup = os.path.join(scratch, f".{os.path.basename(path)}.{secrets.token_hex(4)}.xflow-previous")
            try:
                os.link(path, backup)
            except OSError:  # no hard links here (or another file system): it cannot be put back, leave it be
                continue
            kept[path] = backup
        else:
            kept[path] = None
    try:
        yield
    except BaseException:
        for path, backup in kept.items():
            with contextlib.suppress(OSError):
                if backup is not None:
                    os.replace(backup, path)
                elif os.path.lexists(path):
                    os.remove(path)
        raise
    finally:
        for backup in kept.values():
            if backup is not None and os.path.lexists(backup):
                with contextlib.suppress(OSError):
                    os.remove(backup)


def _start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot; None when there is no such process
    (or no /proc to ask)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    try:  # the command name (field 2) may hold spaces and parentheses: fields resume after the last ')'
        return int(text[text.rindex(")") + 2:].split()[19])
    except (ValueError, IndexError):
        return None


def _owner_alive(pid: int, start: int) -> bool:
    if not os.path.isdir("/proc/self"):  # no way to tell a reused pid: keep folders of any live pid
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return True
    return _start_ticks(pid) == start


def remove_dead_runs(directory: str) -> list[str]:
    """Remove the run folders in ``directory`` whose process is gone; the paths removed."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        found = _RUN_NAME.match(name)
        if found is None or _owner_alive(int(found[1]), int(found[2])):
            continue
        path = os.path.join(directory, name)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    return removed


@contextlib.contextmanager
def run_folder(beside: str) -> Iterator[str]:
    """This run's scratch folder in the directory of ``beside`` (made on entry, removed on exit), after
    removing the folders that killed runs left there. XflowError naming ``beside`` when it cannot be made."""
    directory = os.path.dirname(os.path.abspath(beside))
    remove_dead_runs(directory)
    pid = os.getpid()
    path = os.path.join(directory, f"{RUN_PREFIX}{pid}-{_start_ticks(pid) or 0}")
    try:
        os.mkdir(path)
    except FileExistsError:  # a second run in this process (the API called twice): a folder of its own
        path = f"{path}.{secrets.token_hex(4)}"
        os.mkdir(path)
    except OSError as exc:
        raise XflowError(beside, f"cannot write in {directory}: {exc.strerror or exc}") from None
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)

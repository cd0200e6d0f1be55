"""Files a user names: read within a size limit, written only where a regular file can go.

Every file a user names passes through here: a scenario, a plan, a sweep and its base, a
profile, a schedule file, a measured-run CSV, and what ``--out`` writes. A path is only
text until it is opened, and it may name anything: ``/dev/zero`` (endless), ``/dev/full``
(every write fails), a FIFO (blocks until someone writes to it), a folder, a loop of
symbolic links, a name longer than the file system allows, a NUL byte, or a real file of
60 MB that would take minutes to parse. Each is one line naming the file and what to do,
raised as the caller's ``DappleError`` kind, never a hang or a traceback:

* ``read_user_file`` opens without blocking (``O_NONBLOCK``: a FIFO opens at once), takes
  only a regular file, refuses one over its limit before reading it (and reads at most the
  limit, in case it grows), and decodes it as UTF-8;
* ``user_file_problem`` says why a path cannot be read, for the readers that look a file up
  before reading it (``sim.input.strict.StrictReader.path``);
* ``open_output`` opens an output file for writing: an existing path must be a regular file
  (not a folder, a device or a FIFO), and every error of the writes and the close (a full
  disk) becomes one line naming the file.

The limits are documented in ``docs/scenario.md`` ("Limits").
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from sim.core.errors import DappleError

__all__ = ["CSV_MAX_BYTES", "INPUT_MAX_BYTES", "PROFILE_MAX_BYTES", "open_output", "read_user_file", "show_path",
           "user_file_problem", "write_user_file"]

MiB = 2**20
INPUT_MAX_BYTES = 4 * MiB
"""Largest scenario, plan, sweep or schedule file read (a hand-written file is a few KiB;
the planner's plan files for 10 000 devices about 100 KiB)."""
PROFILE_MAX_BYTES = 16 * MiB
"""Largest profile read (DAPPLE's largest, GNMT-32, is 31 KB)."""
CSV_MAX_BYTES = 16 * MiB
"""Largest measured-run CSV read (``sim.report.analysis.calibrate`` also limits its rows)."""
SHOWN_PATH_CHARS = 160
"""A longer path is shown as its first and last characters around an ellipsis."""

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def show_path(path: str | os.PathLike) -> str:
    """``path`` as an error message shows it: at most ``SHOWN_PATH_CHARS`` characters."""
    text = os.fspath(path) if not isinstance(path, str) else path
    text = text if isinstance(text, str) else repr(text)
    if len(text) <= SHOWN_PATH_CHARS:
        return text
    half = (SHOWN_PATH_CHARS - 3) // 2
    return f"{text[:half]}...{text[-half:]}"


def _reason(exc: BaseException) -> str:
    """Why the operating system refused, in words (``File name too long``)."""
    if isinstance(exc, ValueError):
        return "the path holds a NUL byte"
    if isinstance(exc, OSError) and exc.errno == errno.ELOOP:
        return "a loop of symbolic links"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return exc.__class__.__name__


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _size(nbytes: int) -> str:
    return f"{nbytes / MiB:.1f} MiB" if nbytes >= MiB else f"{nbytes} bytes"


def user_file_problem(path: str | os.PathLike, *, max_bytes: int = INPUT_MAX_BYTES) -> str | None:
    """Why ``path`` cannot be read as an input file (``"no such file"``, ``"it is a folder"``,
    ``"File name too long"``, over ``max_bytes``), or None when it is a regular file within the limit."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return "no such file"
    except (OSError, ValueError) as exc:
        return _reason(exc)
    if not stat.S_ISREG(info.st_mode):
        return f"it is {_kind(info.st_mode)}, not a file"
    if info.st_size > max_bytes:
        return f"it is {_size(info.st_size)}, over the limit of {_size(max_bytes)}"
    return None


def read_user_file(path: str | os.PathLike, what: str, error: type[DappleError] = DappleError, *,
                   max_bytes: int = INPUT_MAX_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``, at most ``max_bytes`` long; anything else
    is ``error`` in one line: ``FILE: no such scenario file``, ``FILE: cannot read scenario
    file (it is a character device, not a file)``, ``FILE: scenario file is 60.0 MiB, over
    the limit of 4.0 MiB``."""
    shown = show_path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{shown}: no such {what}") from None
    except (OSError, ValueError) as exc:
        raise error(f"{shown}: cannot read {what} ({_reason(exc)})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{shown}: cannot read {what} (it is {_kind(info.st_mode)}, not a file); give a file")
        if info.st_size > max_bytes:
            raise error(f"{shown}: {what} is {_size(info.st_size)}, over the limit of {_size(max_bytes)}; "
                        "is this the right file?")
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(MiB, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise error(f"{shown}: {what} grew over the limit of {_size(max_bytes)} while it was read")
    except OSError as exc:
        raise error(f"{shown}: cannot read {what} ({_reason(exc)})") from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{shown}: cannot read {what}: not UTF-8 text (byte {exc.start})") from None


@contextlib.contextmanager
def open_output(path: str | os.PathLike, what: str = "file", *, binary: bool = False,
                error: type[DappleError] = DappleError) -> Iterator[IO]:
    """``path`` opened for writing (created or truncated), for a ``with`` block.

    An existing path must be a regular file: a folder, a device (``/dev/full``) or a FIFO is
    refused before anything is written (a FIFO is opened without blocking). Every ``OSError``
    of the open, the writes and the close is ``error``: ``FILE: cannot write summary
    (No space left on device)``."""
    shown = show_path(path)
    problem = None
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            problem = f"it is {_kind(info.st_mode)}, not a file; remove it or choose another --out"
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        problem = _reason(exc)
    if problem is not None:
        raise error(f"{shown}: cannot write {what} ({problem})")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except (OSError, ValueError) as exc:
        raise error(f"{shown}: cannot write {what} ({_reason(exc)})") from None
    try:
        handle = os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": ""}))
    except OSError as exc:
        os.close(fd)
        raise error(f"{shown}: cannot write {what} ({_reason(exc)})") from None
    try:
        with handle:
            yield handle
    except OSError as exc:
        raise error(f"{shown}: cannot write {what} ({_reason(exc)})") from None


def write_user_file(path: str | Path, text: str, what: str = "file", *, error: type[DappleError] = DappleError) -> None:
    """Write ``text`` to ``path`` through ``open_output``."""
    with open_output(path, what, error=error) as handle:
        handle.write(text)

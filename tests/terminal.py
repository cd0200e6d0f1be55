"""Running a command as in a shell: stderr on a pseudo-terminal, so that what the commands
show only to a person at a terminal (progress bars) is shown, and can be checked."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

__all__ = ["run_on_a_terminal"]


def run_on_a_terminal(argv: list[str], cwd: Path, timeout: float = 300) -> tuple[int, str, str]:
    """Run ``argv`` with stderr on a pseudo-terminal and stdout on a pipe; (exit code,
    stdout, everything written to the terminal)."""
    master, slave = os.openpty()
    process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        stdout, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    finally:
        reader.join(10)
        os.close(master)
    return process.returncode, stdout.decode(), b"".join(chunks).decode(errors="replace")

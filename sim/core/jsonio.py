"""JSON out: strict JSON only, never ``NaN`` or ``Infinity``.

Python's ``json`` writes ``float("inf")`` as ``Infinity`` and ``float("nan")`` as ``NaN``,
which strict parsers (``jq``, browsers' ``JSON.parse``, Perfetto) refuse. Every JSON the
project writes goes through ``dumps`` (``allow_nan=False``): a non-finite number there is an
input whose range check is missing or a bug, and it becomes one line naming the key that holds
it (``summary.json: devices[3].idle_s is inf``) instead of a file no one can read.
``write_json`` writes through ``sim.core.userfiles.open_output``, so an output that is a folder,
a device or a full disk is one line too.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from sim.core.errors import DappleError
from sim.core.userfiles import show_path, write_user_file

__all__ = ["dumps", "write_json"]


def dumps(value: Any, *, what: str = "JSON output", error: type[DappleError] = DappleError, **kwargs: Any) -> str:
    """``json.dumps(value, allow_nan=False, **kwargs)``; a NaN or infinity is ``error`` naming its key."""
    try:
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError:
        where = _non_finite(value)
        if where is None:
            raise  # a circular reference: our bug, not the user's
        key, number = where
        raise error(f"{what}: {key or 'the value'} is {number!r}, not a finite number; a number of the input "
                    "is out of its range (docs/scenario.md lists every range)") from None


def write_json(path: str | os.PathLike, value: Any, *, what: str | None = None,
               error: type[DappleError] = DappleError, **kwargs: Any) -> None:
    """Write ``value`` as JSON (and a newline) to ``path``; nothing is written if it cannot be encoded."""
    text = dumps(value, what=show_path(path), error=error, **kwargs) + "\n"
    write_user_file(path, text, what or os.path.basename(os.fspath(path)), error=error)


def _non_finite(value: Any) -> tuple[str, float] | None:
    """(dotted key, number) of the first NaN or infinity in ``value``, depth first; None if none."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        key, node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return key, node
        if isinstance(node, dict):
            items = [(f"{key}.{k}" if key else str(k), v) for k, v in node.items()]
        elif isinstance(node, (list, tuple)):
            items = [(f"{key}[{i}]", v) for i, v in enumerate(node)]
        else:
            continue
        stack.extend(reversed(items))
    return None

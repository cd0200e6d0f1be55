"""Profiles: models measured layer by layer on real hardware, in PipeDream's graph format.

DAPPLE's planner (Fan et al., PPoPP'21) and PipeDream's (Narayanan et al., SOSP'19) read a
text graph with one line per node, ``nodeN -- NAME -- forward_compute_time=F,
backward_compute_time=B, activation_size=A, parameter_size=P``, then one line per edge,
``<TAB>nodeX -- nodeY``. F and B are milliseconds for one batch of the profile batch size,
A is the bytes of the node's output for that batch (a list ``[a; b]`` when the node has
several outputs: we add them), P the bytes of its parameters.

Every node becomes one layer, in topological order (ties broken by node number, so a
file written in node order keeps its order). The graph is a DAG, not always a chain: BERT's
attention mask feeds every layer. The bytes that cross a cut before layer ``k`` are the
outputs of every node placed before ``k`` that has a consumer at or after ``k``.

As in DAPPLE's planner, times and activation sizes scale linearly with the batch size, so we
store them per sample (divided by the profile batch size). A layer's stashed activation is its
output, as in both planners' memory estimates, unless the line ends with our optional
``, stash_size=S``: the bytes autograd actually saves for the layer's backward, which
``dapple-run profile`` measures.

Limits (``docs/scenario.md``): a file of at most 16 MiB and ``MAX_NODES`` nodes; times from 0
to ``MAX_TIME_MS`` milliseconds and sizes from 0 to ``MAX_BYTES`` (1 PiB) each; and the
forward and backward times must add up to at least ``MIN_TOTAL_MS``, since a model that takes
no time has an iteration time of 0 and infinite throughput.
"""

from __future__ import annotations

import heapq
import re
from pathlib import Path

from sim.core.errors import DappleError
from sim.core.model_spec import LayerSpec, ModelSpec
from sim.core.userfiles import PROFILE_MAX_BYTES, read_user_file, show_path, user_file_problem

__all__ = ["ProfileError", "load_profile", "parse_profile"]

MAX_NODES = 2**14 + 2
"""Most nodes (layers) of a profile, as for a generated model: 2^14 blocks, the embedding and the head."""
MAX_TIME_MS = 1e7
"""Longest forward or backward time of one node for one batch, milliseconds (about 2.8 hours)."""
MAX_BYTES = 2.0**50
"""Largest activation, parameter or stash size of one node, bytes (1 PiB)."""
MIN_TOTAL_MS = 1e-3
"""Least sum of every node's forward and backward time, milliseconds."""

_NODE = re.compile(
    r"^(?P<id>node\d{1,12}) -- (?P<name>.*) -- forward_compute_time=(?P<fwd>[^,]+), "
    r"backward_compute_time=(?P<bwd>[^,]+), activation_size=(?P<act>\[[^\]]*\]|[^,]+), "
    r"parameter_size=(?P<param>[^,\s]+)(?:, stash_size=(?P<stash>[^,\s]+))?\s*$"
)
_EDGE = re.compile(r"^\s+(?P<src>node\d{1,12}) -- (?P<dst>node\d{1,12})\s*$")


class ProfileError(DappleError):
    """A profile file cannot be read; the message names the file and line."""


def load_profile(
    path: str | Path, *, profile_batch_size: int, dtype: str = "fp32", optimizer: str = "adam"
) -> ModelSpec:
    """Read the profile at ``path``, measured at ``profile_batch_size`` samples per batch."""
    path = Path(path)
    problem = user_file_problem(path, max_bytes=PROFILE_MAX_BYTES)
    if problem is not None:
        raise ProfileError(f"{show_path(path)}: cannot read profile ({problem})")
    text = read_user_file(path, "profile", ProfileError, max_bytes=PROFILE_MAX_BYTES)
    return parse_profile(
        text, profile_batch_size=profile_batch_size, name=path.stem, source=str(path), dtype=dtype, optimizer=optimizer
    )


def parse_profile(
    text: str,
    *,
    profile_batch_size: int,
    name: str = "profile",
    source: str = "<text>",
    dtype: str = "fp32",
    optimizer: str = "adam",
) -> ModelSpec:
    """Build a ``ModelSpec`` from profile ``text`` (see the module docstring for the format)."""
    if isinstance(profile_batch_size, bool) or not isinstance(profile_batch_size, int) or profile_batch_size <= 0:
        raise ProfileError(f"{source}: profile_batch_size must be a positive integer, got {profile_batch_size!r}")
    nodes, edges = _read_lines(text, source)
    total_ms = sum(node["fwd_ms"] + node["bwd_ms"] for node in nodes.values())
    if total_ms < MIN_TOTAL_MS:
        raise ProfileError(f"{source}: the forward and backward times add up to {total_ms:g} ms; a measured model "
                           f"takes at least {MIN_TOTAL_MS:g} ms (is this profile empty of times?)")
    order = _topological_order(nodes, edges, source)
    position = {node: index for index, node in enumerate(order)}
    batch = float(profile_batch_size)
    layers = tuple(
        LayerSpec(
            name=nodes[node]["name"],
            fwd_s=nodes[node]["fwd_ms"] / 1e3 / batch,
            bwd_s=nodes[node]["bwd_ms"] / 1e3 / batch,
            output_bytes=nodes[node]["act_bytes"] / batch,
            stash_bytes=(nodes[node]["act_bytes"] if nodes[node]["stash_bytes"] is None else nodes[node]["stash_bytes"])
            / batch,
            param_bytes=nodes[node]["param_bytes"],
        )
        for node in order
    )
    boundary = _boundary_bytes(order, position, nodes, edges)
    return ModelSpec(
        name=name,
        layers=layers,
        boundary_bytes=tuple(b / batch for b in boundary),
        dtype=dtype,
        optimizer=optimizer,
        source=source,
    )


def _number(text: str, what: str, where: str) -> float:
    shown = text[:40] + ("..." if len(text) > 40 else "")
    try:
        value = float(text) if len(text) <= 100 else float("nan")
    except ValueError:
        raise ProfileError(f"{where}: {what} {shown!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise ProfileError(f"{where}: {what} {shown!r} must be a finite number >= 0")
    high = MAX_TIME_MS if what.endswith("_time") else MAX_BYTES
    if value > high:
        limit = f"{high:g} ms" if what.endswith("_time") else "1 PiB (2**50 bytes)"
        raise ProfileError(f"{where}: {what} {shown!r} must be a finite number >= 0 and at most {limit}")
    return value


def _read_lines(text: str, source: str) -> tuple[dict[str, dict], list[tuple[str, str]]]:
    nodes: dict[str, dict] = {}
    edges: list[tuple[str, str]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        where = f"{source}:{lineno}"
        if not line.strip():
            continue
        if match := _EDGE.match(line):
            edges.append((match["src"], match["dst"]))
            continue
        match = _NODE.match(line)
        if match is None:
            raise ProfileError(
                f"{where}: cannot read {line.strip()[:60]!r}; expected 'nodeN -- NAME -- forward_compute_time=..., "
                "backward_compute_time=..., activation_size=..., parameter_size=...' or '<TAB>nodeX -- nodeY'"
            )
        if match["id"] in nodes:
            raise ProfileError(f"{where}: {match['id']} is defined twice")
        if len(nodes) >= MAX_NODES:
            raise ProfileError(f"{where}: more than {MAX_NODES:,} nodes; a model has at most {MAX_NODES:,} layers")
        parts = match["act"].strip("[]").split(";")
        nodes[match["id"]] = {
            "name": match["name"].strip(),
            "fwd_ms": _number(match["fwd"], "forward_compute_time", where),
            "bwd_ms": _number(match["bwd"], "backward_compute_time", where),
            "act_bytes": sum(_number(p.strip(), "activation_size", where) for p in parts),
            "param_bytes": _number(match["param"], "parameter_size", where),
            "stash_bytes": None if match["stash"] is None else _number(match["stash"], "stash_size", where),
        }
    if not nodes:
        raise ProfileError(f"{source}: no node lines; is this a PipeDream/DAPPLE profile?")
    for src, dst in edges:
        for node in (src, dst):
            if node not in nodes:
                raise ProfileError(f"{source}: edge {src} -- {dst} names {node}, which has no node line")
    return nodes, edges


def _topological_order(nodes: dict[str, dict], edges: list[tuple[str, str]], source: str) -> list[str]:
    """Kahn's algorithm; among ready nodes the lowest node number goes first."""
    number = {node: int(node[4:]) for node in nodes}
    indegree = dict.fromkeys(nodes, 0)
    successors: dict[str, list[str]] = {node: [] for node in nodes}
    for src, dst in sorted(set(edges)):
        successors[src].append(dst)
        indegree[dst] += 1
    ready = [(number[n], n) for n, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for nxt in successors[node]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                heapq.heappush(ready, (number[nxt], nxt))
    if len(order) != len(nodes):
        stuck = sorted((n for n in nodes if indegree[n] > 0), key=number.get)
        raise ProfileError(f"{source}: the graph has a cycle through {', '.join(stuck[:4])}")
    return order


def _boundary_bytes(
    order: list[str], position: dict[str, int], nodes: dict[str, dict], edges: list[tuple[str, str]]
) -> list[float]:
    """Bytes crossing each cut, for the whole profile batch (``len(order) + 1`` entries)."""
    last_consumer = {node: -1 for node in order}
    has_producer = set()
    for src, dst in edges:
        last_consumer[src] = max(last_consumer[src], position[dst])
        has_producer.add(dst)
    delta = [0.0] * (len(order) + 2)
    for node in order:
        # The output of ``node`` crosses cuts pos+1 .. last consumer's position.
        first, last = position[node] + 1, last_consumer[node]
        if last >= first:
            delta[first] += nodes[node]["act_bytes"]
            delta[last + 1] -= nodes[node]["act_bytes"]
    boundary, running = [], 0.0
    for k in range(len(order) + 1):
        running += delta[k]
        boundary.append(running)
    # The model input: what the source nodes (data loaders, masks) produce for the first stage.
    boundary[0] = sum(nodes[n]["act_bytes"] for n in order if n not in has_producer)
    boundary[-1] = 0.0
    return boundary

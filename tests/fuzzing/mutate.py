"""Mutations of the inputs the fuzz feeds the commands: YAML text and data, JSON text, CSV
cells, schedule tokens, and the odd values they swap in.

Every function takes an explicit ``random.Random`` so that a seed replays to the same bytes.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import yaml

ZWSP = "\u200b"
"""A zero-width space: a key that prints like ``devices`` but is not it."""

HUGE = [2**20, 2**17 + 1, 400_000, 100_000, 16_385, 10**9, 3.2e8, 10**12, 10**30, 1e308, 2**63, -(2**63)]
ODD = [None, True, False, 0, -1, -2.5, 0.5, 1.5, 3, 7, "", " ", "x", "nan", "inf", "-inf", "1e400", "25Gbs",
       "16GB/s", "-5us", "5GiB", "2ms", "1e3", "0x10", "1_000", "∞", [], [0], [0, 0], [-1], [[0, 1]], {},
       {"a": 1}, {"name": "dapple"}, "0-3", "0-99999999999", "3-1", "dapple", "interleaved", float("nan"),
       float("inf"), float("-inf"), 1e-300, -0.0]
TAGS = ["!!timestamp 99999-01-01", "!!bool maybe", "!!int 1e3", "!!float abc", "!!int 0x", "!!binary ???",
        "!!set {a, b}", "!!omap [a: 1]", "!!str 4", "!!null x", "!!float .nan", "!!float -.inf", "!foo bar",
        "!!python/object:os.system ls", "!!timestamp 2001-02-30", "!!int 99999999999999999999999999",
        "!!seq x", "!!map x", "!!merge x", "!!value x", "!!pairs [a: 1]", "!!timestamp 1e9"]
KEY_TYPOS = [lambda k: k + ZWSP, lambda k: ZWSP + k, lambda k: k[:-1], lambda k: k + "s", lambda k: k.upper(),
             lambda k: k.replace("_", "-"), lambda k: k.replace("e", "\u0435"), lambda k: k + " ", lambda k: "_" + k,
             lambda k: k + "\u00a0"]


def odd_value(rng: random.Random, key: str = "") -> Any:
    """An odd value; a size-like key draws a huge one half the time."""
    if rng.random() < 0.35:
        value = rng.choice(HUGE)
        return -value if rng.random() < 0.1 else value
    return copy.deepcopy(rng.choice(ODD))


def paths(node: Any, prefix: tuple = ()):
    """Every (path, value) below ``node``: mappings by key, lists by index."""
    yield prefix, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from paths(value, prefix + (index,))


def _parent(root: Any, path: tuple) -> Any:
    node = root
    for part in path[:-1]:
        node = node[part]
    return node


def mutate_data(raw: Any, rng: random.Random, steps: int) -> Any:
    """Delete, rename, retype, empty, duplicate or scale what ``raw`` holds, ``steps`` times."""
    raw = copy.deepcopy(raw)
    for _ in range(steps):
        found = [p for p, _ in paths(raw) if p]
        if not found:
            return odd_value(rng)
        path = rng.choice(found)
        parent, last = _parent(raw, path), path[-1]
        action = rng.randrange(7)
        if action == 0:
            del parent[last]
        elif action == 1 and isinstance(last, str):
            parent[rng.choice(KEY_TYPOS)(last)] = parent.pop(last)
        elif action == 2 and isinstance(parent[last], (int, float)) and not isinstance(parent[last], bool):
            parent[last] = parent[last] * rng.choice([-1, 0, 2, 10, 1000, 10**6, 0.5, 1.0001])
        elif action == 3 and isinstance(parent[last], list):
            parent[last] = parent[last] * rng.choice([0, 2, 50])
        elif action == 4 and isinstance(parent[last], dict):
            parent[last][rng.choice(["extra", "name", "devices", "layers", ZWSP])] = odd_value(rng)
        elif last == "name":  # the name is echoed: "inf" there is the user's word, not a computed infinity
            parent[last] = rng.choice(["", " ", 0, None, [], {}, "x" * 300, ZWSP, "a\nb"])
        else:
            parent[last] = odd_value(rng, str(last))
    return raw


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=10**6)


def nested(depth: int, kind: str) -> str:
    return "[" * depth + "]" * depth if kind == "list" else "{a: " * depth + "1" + "}" * depth


def bomb(levels: int, width: int) -> str:
    """A flow list whose aliases expand to ``width ** levels`` items ("billion laughs")."""
    parts = [f"&a0 [{', '.join(['x'] * width)}]"]
    parts += [f"&a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


def _value_lines(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if ":" in line and not line.lstrip().startswith("#")
            and line.split(":", 1)[1].strip() not in ("", "|", ">")]


def mutate_yaml_text(text: str, rng: random.Random) -> str:
    """One structural change to YAML text: tags, anchors and aliases, repeated, deleted or
    renamed keys, deep nesting, alias bombs, tabs, a second document, odd bytes."""
    lines = text.splitlines()
    valued = _value_lines(lines) or [0]
    i = rng.choice(valued)
    head, _, _ = lines[i].partition(":")
    action = rng.randrange(14)
    if action == 0:
        lines[i] = f"{head}: {rng.choice(TAGS)}"
    elif action == 1:
        del lines[i]
    elif action == 2:
        lines.insert(i + 1, lines[i])  # a repeated key
    elif action == 3:
        indent = head[:len(head) - len(head.lstrip())]
        lines[i] = indent + rng.choice(KEY_TYPOS)(head.strip()) + ":" + lines[i].partition(":")[2]
    elif action == 4:
        lines[i] = f"{head}: {nested(rng.choice([10, 64, 65, 500, 3000]), rng.choice(['list', 'map']))}"
    elif action == 5:
        lines[i] = f"{head}: {bomb(rng.randint(3, 9), rng.randint(2, 12))}"
    elif action == 6:
        j = rng.choice(valued)
        lines[i] = f"{head}: &x {lines[i].partition(':')[2].strip()}"
        lines[j] = f"{lines[j].partition(':')[0]}: *x"
    elif action == 7:
        lines[i] = f"{head}: *undefined"
    elif action == 8:
        lines[i] = lines[i].replace("  ", "\t", 1)
    elif action == 9:
        lines.append(rng.choice(["---", "--- !!str x", "...", "<<: {a: 1}", "? [a, b]\n: 1", "%YAML 1.1"]))
    elif action == 10:
        lines = lines[: rng.randrange(len(lines) + 1)]
    elif action == 11:
        lines[i] = f"{head}: {json.dumps(odd_value(rng, head.strip()))}"
    elif action == 12:
        lines.insert(i, rng.choice(["<<: *x", "&x a: 1", "{a: 1}: 2", "[1]: 2", "null: 1", "1: 2", "? |\n  k\n: 3"]))
    else:
        lines[i] = lines[i] + rng.choice(["\x00", "\x85", "\ufeff", "\u2028", "\udcff", "\x1b[2J"])
    return "\n".join(lines) + "\n"


def mutate_json_text(text: str, rng: random.Random) -> str:
    """One change to JSON text that ``json.loads`` may still take: NaN, 1e999, a repeated or
    zero-width key, deep nesting, truncation, a byte-order mark."""
    action = rng.randrange(8)
    if action == 0:
        return text.replace("16", rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "16.0", "-16", "1e30"]), 1)
    if action == 1:
        return text.replace('"devices"', f'"devi{ZWSP}ces"' if rng.random() < 0.5 else f'"devices{ZWSP}"', 1)
    if action == 2:
        return text.replace("{", '{"stages": [], ', 1)  # a repeated key
    if action == 3:
        depth = rng.choice([5, 64, 1000, 100_000])
        return text.replace("[0", "[" * depth + "0" + "]" * depth + ", [0", 1)
    if action == 4:
        return text[: rng.randrange(len(text) + 1)]
    if action == 5:
        return "\ufeff" + text
    if action == 6:
        return text.replace("[", '[{"a": 1}, ', 1)
    return text.replace('"layers"', '"layers", "layers"', 1)


def mutate_tokens(text: str, rng: random.Random, sep: str = " ", *, big: bool = True) -> str:
    """A schedule's action text or CSV with a token dropped, repeated, swapped or garbled (with
    ``big``, a line may be repeated up to 10,000 times: megabytes to read)."""
    lines = [line.split(sep) for line in text.splitlines() if line and not line.startswith("#")]
    if not lines:
        return text
    row = rng.randrange(len(lines))
    tokens = lines[row]
    k = rng.randrange(len(tokens))
    action = rng.randrange(9)
    if action == 0:
        del tokens[k]
    elif action == 1:
        tokens.insert(k, tokens[k])
    elif action == 2:
        j = rng.randrange(len(tokens))
        tokens[k], tokens[j] = tokens[j], tokens[k]
    elif action == 3:
        tokens[k] = rng.choice(["0F999999999", "9F0", "0X0", "F0", "0F-1", "0f0", "", "0F0F0", "0B", "0W0",
                                "0SEND_F0", "0RECV_B99", "0REDUCE_GRAD", "0I0", "0W0", "00000000000000000F0"])
    elif action == 4:
        del lines[row]
    elif action == 5:
        lines.append(list(tokens))
    elif action == 6:
        lines[row] = tokens * rng.choice([100, 10_000] if big else [100])
    elif action == 7:
        lines.insert(0, ["rank", "actions"])
    else:
        tokens[k] = tokens[k].replace("0", "1")
    return "\n".join(sep.join(tokens) for tokens in lines) + "\n"


def mutate_csv(text: str, rng: random.Random) -> str:
    """A measured-run CSV with an odd cell, a column dropped, renamed or repeated, ragged or
    many rows."""
    rows = [line.split(",") for line in text.splitlines()]
    action = rng.randrange(8)
    if action <= 2 and len(rows) > 1:
        r, c = rng.randrange(1, len(rows)), rng.randrange(len(rows[0]))
        if c < len(rows[r]):
            rows[r][c] = str(rng.choice(["nan", "inf", "-inf", "-1", "0", "1e308", "", "abc", "1e9", "2.5",
                                         "1000000000", "4294967296", "0x10", " 1", "1e-320", "NaN", "true"]))
    elif action == 3:
        c = rng.randrange(len(rows[0]))
        rows = [row[:c] + row[c + 1:] for row in rows]
    elif action == 4:
        rows[0][rng.randrange(len(rows[0]))] += rng.choice(["x", ZWSP, " "])
    elif action == 5:
        c = rng.randrange(len(rows[0]))
        rows = [row + [row[c]] if c < len(row) else row for row in rows]
    elif action == 6 and len(rows) > 1:
        rows[rng.randrange(1, len(rows))].append("1")
    else:
        rows = rows[:1] + rows[1:] * rng.choice([0, 1, 10])  # a fit's time grows with its runs
    return "\n".join(",".join(row) for row in rows) + "\n"

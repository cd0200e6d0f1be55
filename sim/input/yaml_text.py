"""YAML a user wrote, read with limits: nesting, size with aliases expanded, number length.

YAML lets a small file describe a huge value. An alias (``*a``) repeats an anchored node
(``&a``), so nine levels of ten aliases each ("billion laughs") are a 1.5 KB file whose value,
written out, has 10⁹ items: printing, hashing or copying it never ends. Brackets nested 500
deep overflow the recursion of every reader, and an integer of 5000 digits cannot even be
printed (Python refuses to turn integers of more than 4300 digits into text). ``load_yaml``
refuses each while it composes the document, before a single value is built:

* nesting deeper than ``MAX_DEPTH`` mappings and lists, aliases expanded;
* more than ``MAX_NODES`` values (keys, items and scalars), every alias counted as the
  values it repeats;
* an alias inside the node it names (a value that contains itself);
* a number written with more than ``MAX_NUMBER_CHARS`` characters;
* a key written twice in one mapping (``nodes: 2`` then ``nodes: 4``): YAML 1.2 says keys are
  unique, but PyYAML keeps the last silently, so a file would mean what its second line says.

Every refusal, like a syntax error, is one line naming the source, the line and the column.
``check_nesting`` applies the same limits to a value that did not come from YAML (a plan file's
JSON). The parser is libyaml's when PyYAML has it (five times faster on a large file), the
composer PyYAML's with these checks, the constructor PyYAML's safe one.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, ScalarEvent
from yaml.resolver import Resolver

from sim.core.errors import DappleError, ScenarioError

__all__ = ["MAX_DEPTH", "MAX_NODES", "MAX_NUMBER_CHARS", "check_nesting", "load_yaml"]

MAX_DEPTH = 64
"""Deepest nesting of mappings and lists (a scenario nests 5 deep, a sweep of whole plans 8)."""
MAX_NODES = 250_000
"""Most values in one document with every alias expanded (the largest shipped scenario has
about 300; a sweep of 10 000 explicit points of 10 keys, 200 000). Reading 250 000 values
takes about a second and 90 MB."""
MAX_NUMBER_CHARS = 100
"""Longest number, in characters (no valid value needs more than 20)."""

_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class _Refused(Exception):
    """A limit was hit at ``mark``."""

    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem)
        self.problem, self.mark = problem, mark


class _Limits(Composer):
    """PyYAML's composer, counting values and nesting as it goes (aliases expanded)."""

    def _start_limits(self) -> None:
        self._nodes = 0
        self._heights = [0]  # for each node being composed: the tallest of its children so far
        self._anchored: dict[str, tuple[int, int]] = {}  # anchor -> (values, height) of its node

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            if event.anchor in self.anchors and event.anchor not in self._anchored:
                raise _Refused(f"alias *{event.anchor} is inside the node it names (a value that contains itself)",
                               event.start_mark)
            size, height = self._anchored.get(event.anchor, (1, 1))  # an undefined alias: the composer says so
            self._grow(size, len(self._heights) - 1 + height, event)
            self._heights[-1] = max(self._heights[-1], height)
            return super().compose_node(parent, index)
        before = self._nodes
        self._grow(1, len(self._heights), event)
        self._heights.append(0)
        node = super().compose_node(parent, index)
        height = 1 + self._heights.pop()
        self._heights[-1] = max(self._heights[-1], height)
        if isinstance(event, ScalarEvent) and node.tag in _NUMBER_TAGS and len(node.value) > MAX_NUMBER_CHARS:
            raise _Refused(f"a number of {len(node.value)} characters; numbers here have at most {MAX_NUMBER_CHARS}",
                           event.start_mark)
        if event.anchor is not None:
            self._anchored[event.anchor] = (self._nodes - before, height)
        return node

    def _grow(self, values: int, depth: int, event) -> None:
        self._nodes += values
        if self._nodes > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES:,} values (aliases expanded); is this the right file?",
                           event.start_mark)
        if depth > MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} mappings and lists (aliases expanded)", event.start_mark)



def _checked(tag: str, construct: Any) -> Any:
    """``construct`` (SafeConstructor's for ``!!tag``), refusing a value it cannot read in one line.

    PyYAML's resolver gives a plain scalar the tag its text matches, so its constructors assume
    that match; an explicit tag skips the resolver (``!!int 1e3``, ``!!bool maybe``,
    ``!!timestamp 99999-01-01``) and the constructor fails inside with a ValueError, KeyError or
    AttributeError. A date the resolver matched may still not exist (``2024-13-45``)."""

    def checked(self, node):
        try:
            return construct(self, node)
        except (ValueError, KeyError, AttributeError, IndexError, TypeError, OverflowError):
            shown = node.value[:40] if isinstance(node.value, str) else "?"
            raise _Refused(f"{shown!r} is not a valid !!{tag}; write {_TAG_MEANS[tag]}, or quote the value "
                           "to make it text", node.start_mark) from None

    return checked


_TAG_MEANS = {"bool": "true or false", "int": "a whole number such as 12", "float": "a number such as 1.5",
              "timestamp": "a date such as 2024-01-31"}
"""What each scalar tag's value must look like (YAML 1.1's core types), for the refusal."""


class _UniqueKeys(SafeConstructor):
    """PyYAML's safe constructor, refusing a key that a mapping repeats (the keys a merge key,
    ``<<``, brings in may still be overridden: that is what merging is for)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key, line = self.construct_object(key_node, deep=deep), key_node.start_mark.line + 1
                try:
                    first = first_line.get(key)
                except TypeError:  # an unhashable key: PyYAML's own construct_mapping says so
                    continue
                if first is not None:
                    lines = f"twice at line {line}" if first == line else f"at lines {first} and {line}"
                    raise _Refused(f"key {str(key_node.value)[:40]!r} appears {lines} in one mapping; keep one",
                                   key_node.start_mark)
                first_line[key] = line
        return super().construct_mapping(node, deep=deep)


try:
    from yaml._yaml import CParser as _Parser

    class _Loader(_Limits, _Parser, _UniqueKeys, Resolver):
        def __init__(self, stream: str) -> None:
            _Parser.__init__(self, stream)
            _Limits.__init__(self)
            _UniqueKeys.__init__(self)
            Resolver.__init__(self)
            self._start_limits()

except ImportError:  # PyYAML without libyaml: the pure-Python parser
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Loader(Reader, Scanner, Parser, _Limits, _UniqueKeys, Resolver):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)
            _Limits.__init__(self)
            _UniqueKeys.__init__(self)
            Resolver.__init__(self)
            self._start_limits()


_Loader.yaml_constructors = dict(SafeConstructor.yaml_constructors)
for _tag in sorted(_TAG_MEANS):
    _full = f"tag:yaml.org,2002:{_tag}"
    _Loader.yaml_constructors[_full] = _checked(_tag, SafeConstructor.yaml_constructors[_full])


def load_yaml(text: str, *, where: str, error: type[DappleError] = ScenarioError) -> Any:
    """The value of YAML ``text``; a syntax error or a limit is ``error`` in one line,
    ``WHERE: not valid YAML at line 3, column 7: ...`` (``where`` names the file or option).
    Text that holds a lone surrogate (a ``--set`` value whose bytes were not UTF-8: Python
    keeps them as ``\udcff``) is refused too: libyaml cannot encode it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{where}: not UTF-8 text (character {exc.start + 1} is a byte no UTF-8 text holds); "
                    "write it in UTF-8") from None
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except _Refused as exc:
        raise error(f"{where}: {_at(exc.mark)}{exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["unreadable"])[0]
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise error(f"{where}: not valid YAML{at}: {problem}") from None
    except RecursionError:  # not reached within MAX_DEPTH; kept so that no input gives a traceback
        raise error(f"{where}: nested too deep to read") from None
    finally:
        loader.dispose()


def _at(mark: Any) -> str:
    return f"at line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


def check_nesting(value: Any, *, where: str, error: type[DappleError] = ScenarioError) -> None:
    """Refuse ``value`` (a plan file's JSON) when it nests deeper than ``MAX_DEPTH`` or holds
    more than ``MAX_NODES`` values, without recursion (shared lists count each time they appear)."""
    stack, count = [(value, 1)], 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise error(f"{where}: more than {MAX_NODES:,} values; is this the right file?")
        if depth > MAX_DEPTH:
            raise error(f"{where}: nested deeper than {MAX_DEPTH} objects and lists")
        if isinstance(node, dict):
            stack.extend((item, depth + 1) for pair in node.items() for item in pair)
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)

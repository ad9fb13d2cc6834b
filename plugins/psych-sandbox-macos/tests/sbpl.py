"""A small reading of the SBPL the generator writes, to test what a profile allows on a host
that has no seatbelt.

It models the subset the generator uses, as Apple's sandbox applies it: rules are read in
order and the last one that matches an operation decides; ``(deny default)`` matches every
operation; an operation name ending in ``*`` matches every operation it prefixes; ``subpath``
matches a path and everything below it (``/a/b`` does not match ``/a/bc``); ``literal``
matches the path alone; ``(param "NAME")`` is the value passed as ``-D NAME=VALUE``. Anything
else in a rule (a filter it does not know) makes it fail loudly rather than guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

Atom = str
Expression = Union[Atom, "String", list["Expression"]]


@dataclass(frozen=True)
class String:
    value: str


def parse(text: str) -> list[Expression]:
    """Every top-level expression of ``text`` (comments dropped)."""
    tokens = _tokens(text)
    position = 0
    out: list[Expression] = []

    def read() -> Expression:
        nonlocal position
        token = tokens[position]
        position += 1
        if token == "(":
            items: list[Expression] = []
            while tokens[position] != ")":
                items.append(read())
            position += 1
            return items
        if token == ")":
            raise ValueError("unbalanced )")
        return token

    while position < len(tokens):
        out.append(read())
    return out


def _tokens(text: str) -> list[Atom | String]:
    tokens: list[Atom | String] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == ";":
            while i < len(text) and text[i] != "\n":
                i += 1
        elif c in "()":
            tokens.append(c)
            i += 1
        elif c.isspace():
            i += 1
        elif c == '"':
            j = i + 1
            value = []
            while text[j] != '"':
                if text[j] == "\\":
                    j += 1
                value.append(text[j])
                j += 1
            tokens.append(String("".join(value)))
            i = j + 1
        else:
            j = i
            while j < len(text) and not text[j].isspace() and text[j] not in '()";':
                j += 1
            tokens.append(text[i:j])
            i = j
    return tokens


@dataclass(frozen=True)
class Rule:
    allow: bool
    operation: str
    #: (kind, path) pairs, kind "subpath" or "literal"; empty means every path. None for a
    #: rule whose filters are not about paths (e.g. signal targets).
    paths: tuple[tuple[str, str], ...] | None


def rules(text: str, parameters: dict[str, str]) -> list[Rule]:
    out: list[Rule] = []
    for expression in parse(text):
        assert isinstance(expression, list) and expression, expression
        head = expression[0]
        if head == "version":
            continue
        assert head in ("allow", "deny"), expression
        operation = expression[1]
        assert isinstance(operation, str)
        filters = expression[2:]
        paths: list[tuple[str, str]] = []
        other = False
        for item in filters:
            assert isinstance(item, list), item
            kind = item[0]
            if kind == "target":
                other = True
                continue
            assert kind in ("subpath", "literal"), f"unknown filter {item}"
            value = item[1]
            if isinstance(value, list):
                assert value[0] == "param" and isinstance(value[1], String), value
                path = parameters[value[1].value]
            else:
                assert isinstance(value, String), value
                path = value.value
            paths.append((kind, path))
        out.append(Rule(head == "allow", operation, None if other else tuple(paths)))
    return out


def _operation_matches(rule_operation: str, operation: str) -> bool:
    if rule_operation == "default":
        return True
    if rule_operation.endswith("*"):
        return operation.startswith(rule_operation[:-1])
    return rule_operation == operation


def _path_matches(kind: str, pattern: str, path: str) -> bool:
    if kind == "literal":
        return path == pattern
    return path == pattern or path.startswith(pattern.rstrip("/") + "/")


def allowed(text: str, parameters: dict[str, str], operation: str, path: str | None = None) -> bool:
    """Whether the profile allows ``operation`` (on ``path``): the last matching rule."""
    verdict: bool | None = None
    for rule in rules(text, parameters):
        if not _operation_matches(rule.operation, operation):
            continue
        if rule.paths is None:
            continue  # about processes, not paths: never grants a file or network operation
        if rule.paths and (
            path is None
            or not any(_path_matches(kind, pattern, path) for kind, pattern in rule.paths)
        ):
            continue
        verdict = rule.allow
    assert verdict is not None, "a profile must start from (deny default)"
    return verdict

"""A validation error of the deployment's settings said as one line per problem, each naming
its dotted key and, for an unknown key, the closest known one (the configuration file's and a
backend's own options alike)."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError


def describe_errors(
    exc: ValidationError,
    prefix: tuple[str | int, ...] = (),
    model: type[BaseModel] | None = None,
) -> str:
    """One line per problem, each naming its dotted key. With the ``model`` that was
    validated, an unknown key names the closest known one."""
    problems = []
    for err in exc.errors(include_url=False, include_input=False):
        key = ".".join(str(part) for part in (*prefix, *err["loc"])) or "(top level)"
        message = err["msg"]
        if err["type"] == "extra_forbidden" and model is not None:
            message = "unknown key" + _closest(str(err["loc"][-1]), _keys_at(model, err["loc"]))
        problems.append(f"{key}: {message}")
    return "; ".join(problems)


def _closest(word: str, known: Sequence[str]) -> str:
    """A hint naming the known word closest to ``word``, or listing them all."""
    if not known:
        return ""
    match = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    if match:
        return f" (did you mean {match[0]!r}?)"
    return f" (known keys: {', '.join(sorted(known))})"


def _keys_at(model: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    """The keys the model accepts at ``loc``'s parent: follows fields into nested models
    and the values of mappings (a profile name, an option's name)."""
    current: Any = model
    for part in loc[:-1]:
        current = _model_or_mapping(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return []
            current = field.annotation
        elif typing.get_origin(current) is dict:
            current = typing.get_args(current)[1]
        else:
            return []
    current = _model_or_mapping(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_or_mapping(annotation: Any) -> Any:
    """``annotation`` without an optional's None: the model or mapping inside it."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if arg is not type(None):
                return _model_or_mapping(arg)
    return annotation

"""Recipes: a dataclass filled from a YAML file in train/recipes/, overridden by `key=value` arguments
(dotted keys reach nested dataclasses: `optim.lr=2e-5`), and saved with every run."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")
RECIPES = Path(__file__).parent / "recipes"


class RecipeError(ValueError):
    """A recipe or an override that does not fit the config; the message names the key."""


def find_recipe(name_or_path: str) -> Path:
    """A path, or the name of a file in train/recipes/ (with or without .yaml)."""
    for p in (Path(name_or_path), RECIPES / name_or_path, RECIPES / f"{name_or_path}.yaml"):
        if p.is_file():
            return p
    known = ", ".join(sorted(p.stem for p in RECIPES.glob("*.yaml")))
    raise RecipeError(f"no recipe {name_or_path!r}: give a YAML file or one of {known}")


def build(cls: type[T], values: dict[str, Any], where: str = "") -> T:
    """A dataclass from a dict, nested dataclasses included; unknown keys are errors."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = set(values) - set(fields)
    if unknown:
        raise RecipeError(f"unknown key(s) {', '.join(sorted(where + k for k in unknown))}; "
                          f"{cls.__name__} has {', '.join(fields)}")
    kwargs = {}
    for key, value in values.items():
        hint = hints[key]
        value = _coerce(hint, value, where + key)
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = build(hint, value, f"{where}{key}.")
        elif typing.get_origin(hint) is list and isinstance(value, list):
            (item,) = typing.get_args(hint)
            if dataclasses.is_dataclass(item):  # e.g. the RL stages
                value = [build(item, v, f"{where}{key}[{i}].") if isinstance(v, dict) else v
                         for i, v in enumerate(value)]
        kwargs[key] = value
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, key: str) -> Any:
    """YAML reads `2e-5` as a string (its floats need a dot): numbers given for float/int fields become numbers."""
    kinds = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if float in kinds and isinstance(value, (str, int)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            raise RecipeError(f"{key} must be a number, got {value!r}") from None
    if int in kinds and isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            raise RecipeError(f"{key} must be an integer, got {value!r}") from None
    return value


def load(cls: type[T], recipe: str | None, overrides: list[str] | tuple[str, ...] = (),
         changes: dict[str, Any] | None = None) -> T:
    """The recipe's values, then the `key=value` overrides (values read as YAML), then `changes` (dotted keys to
    Python values, e.g. a scale-down overlay)."""
    values: dict[str, Any] = {}
    if recipe:
        loaded = yaml.safe_load(find_recipe(recipe).read_text()) or {}
        if not isinstance(loaded, dict):
            raise RecipeError(f"{recipe}: a recipe is a YAML mapping of settings")
        values = loaded
    for item in overrides:
        if "=" not in item:
            raise RecipeError(f"override {item!r} must be key=value (e.g. optim.lr=2e-5)")
        key, raw = item.split("=", 1)
        _put(values, key, yaml.safe_load(raw) if raw else "")
    for key, value in (changes or {}).items():
        _put(values, key, value)
    from .config import refuse_moved
    from .push import refuse_old_knobs

    try:
        refuse_old_knobs(values)
        refuse_moved(values)
    except ValueError as e:
        raise RecipeError(str(e)) from None
    return build(cls, values)


def _put(values: dict[str, Any], key: str, value: Any) -> None:
    node = values
    *parents, last = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value


def flat(config: Any) -> dict[str, Any]:
    """A config as dotted keys (`optim.lr`, `stages[2].filter_solved`) to leaf values."""
    out: dict[str, Any] = {}

    def walk(value: Any, key: str) -> None:  # an empty mapping has no keys: it adds nothing
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]")
        else:
            out[key] = value

    walk(dataclasses.asdict(config), "")
    return out


def diff(before: Any, after: Any) -> list[tuple[str, Any, Any]]:
    """(key, before, after) for every dotted key whose value differs between two configs of one class."""
    a, b = flat(before), flat(after)
    return [(k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def dump(config: Any) -> str:
    return yaml.safe_dump(dataclasses.asdict(config), sort_keys=False)

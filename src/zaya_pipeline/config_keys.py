"""Config keys and command-line overrides checked against a schema (``config.ZayaConfig``, passed in: this
module sits below config.py) and the groups of ``conf/``, for errors of one line: a mistyped key names the
closest valid key, an unknown group member lists the group's members. Hydra's own messages for these are
many lines and, for a mistyped key, suggest ``+key=...``, which the schema then refuses."""

from __future__ import annotations

import difflib
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from zaya_pipeline.errors import ConfigError, first_line


def _schema_node(key: str, schema: type) -> str:
    """What the dotted ``key`` is in ``schema``: "node" (a config dataclass), "leaf", "open" (under a dict,
    list or Any field, whose keys the schema does not fix) or "unknown"."""
    hint: Any = schema
    for part in key.split("."):
        if not is_dataclass(hint):
            open_ = hint is Any or typing.get_origin(hint) in (dict, list)
            return "open" if open_ else "unknown"
        hints = typing.get_type_hints(hint)
        if part not in {f.name for f in fields(hint)}:
            return "unknown"
        hint = hints[part]
    return "node" if is_dataclass(hint) else "leaf"


def schema_keys(schema: type, prefix: str = "") -> list[str]:
    """Every dotted key ``schema`` declares, nodes and leaves (``train``, ``train.max_steps``, ...)."""
    keys = []
    for f in fields(schema):
        key, hint = f"{prefix}{f.name}", typing.get_type_hints(schema)[f.name]
        keys.append(key)
        if is_dataclass(hint):
            keys += schema_keys(hint, f"{key}.")
    return keys


def unknown_key(key: str, schema: type, extra: tuple[str, ...] = ()) -> str | None:
    """None when ``key`` is in ``schema`` (or one of ``extra``, e.g. the config groups), else a one-line
    message naming it with the closest valid key, or the valid keys at its level."""
    if key in extra or _schema_node(key, schema) != "unknown":
        return None
    keys = [*schema_keys(schema), *extra]
    parent, _, leaf = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == parent}
    close = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.6)
    guesses = [siblings[close[0]]] if close else [k for k in keys if k.rpartition(".")[2] == leaf]
    guesses = guesses or difflib.get_close_matches(key, keys, n=1, cutoff=0.8)
    if guesses:  # a near name at its level, else the same name at other levels, else a near dotted key
        return f"unknown config key '{key}': did you mean {' or '.join(repr(g) for g in guesses[:3])}?"
    if siblings:
        return f"unknown config key '{key}': the keys of {parent or 'the config'} are {', '.join(siblings)}"
    return f"unknown config key '{key}'"


def group_members(group: str, conf_dir: Path) -> list[str]:
    """The members of config group ``group`` (``model``, ``train/optim``): the names of its YAML files."""
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def check_member(group: str, member: str, conf_dir: Path) -> None:
    """ConfigError listing the members of ``group`` unless ``member`` is one."""
    members = group_members(group, conf_dir)
    if member not in members:
        raise ConfigError(
            f"unknown {group} config '{member}' (no {conf_dir.name}/{group}/{member}.yaml): "
            f"choose one of {', '.join(members)}"
        )


def check_overrides(overrides: list[str] | tuple[str, ...], conf_dir: Path, schema: type) -> None:
    """Check Hydra overrides before composing: each parses, each ``group=member`` names an existing member
    (every member of a sweep), each ``key=value`` a key of ``schema``. ``+key``, ``++key``, ``~key`` and
    ``hydra.*`` / ``hydra/*`` overrides are left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    groups = tuple(str(p.relative_to(conf_dir)) for p in conf_dir.glob("**/") if p != conf_dir)
    for text in overrides:
        try:
            o = parser.parse_override(text)
        except HydraException as exc:
            raise ConfigError(f"cannot parse override {text!r}: {first_line(exc)}") from None
        key = o.key_or_group
        if o.is_add() or o.is_force_add() or o.is_delete() or key.split("/")[0].split(".")[0] == "hydra":
            continue
        if key not in groups:
            if message := unknown_key(key, schema, extra=groups):
                raise ConfigError(message)
            continue
        if o.value_type in (ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP, ValueType.RANGE_SWEEP):
            values = list(o.sweep_string_iterator())
        elif o.value_type == ValueType.ELEMENT:
            value = o.value()
            values = value if isinstance(value, list) else [value]
        else:  # glob(...), interval(...): Hydra expands or rejects them
            values = []
        for member in values:
            if member is not None:
                check_member(key, str(member), conf_dir)

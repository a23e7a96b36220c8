"""Which config keys a stage reads: the evidence behind each DVC stage's ``params`` list.

``zaya <stage>`` with ``$ZAYA_CONFIG_READS`` set to a folder writes ``<folder>/<stage>.json``: the sorted
dotted keys of every config field the stage read while it ran (``train.optim.lr``; a dict or list field
counts as one key, ``data.curate.steps``). tests/test_e2e.py runs the debug pipeline that way and checks
each stage's ``params`` in dvc.yaml against what it read.

How: while recording, the config dataclasses' ``__getattribute__`` notes reads of fields of the objects in
the stage's config tree. Copies made with ``dataclasses.replace`` read every field of the original, so they
count as reads of all of them (a superset, never a miss). Dumping the whole config for logging (MLflow
params, the registered model's lineage) goes through ``unrecorded()``: logging what the config was is not
a read of it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

ENV = "ZAYA_CONFIG_READS"

_state = threading.local()


def _tree(node: Any, prefix: str, out: dict[int, tuple[str, frozenset[str], type]]) -> None:
    names = frozenset(f.name for f in fields(node))
    out[id(node)] = (prefix, names, type(node))
    for name in names:
        value = object.__getattribute__(node, name)
        if is_dataclass(value):
            _tree(value, f"{prefix}{name}.", out)


@contextmanager
def unrecorded() -> Iterator[None]:
    """Reads inside this block are not recorded (a whole-config dump for logging)."""
    before = getattr(_state, "paused", False)
    _state.paused = True
    try:
        yield
    finally:
        _state.paused = before


@contextmanager
def recording_reads(cfg: Any) -> Iterator[set[str]]:
    """Record the dotted keys of the fields of ``cfg`` (a config dataclass tree) read inside the block."""
    nodes: dict[int, tuple[str, frozenset[str], type]] = {}
    _tree(cfg, "", nodes)
    reads: set[str] = set()

    def getattribute(self: Any, name: str) -> Any:
        value = object.__getattribute__(self, name)
        node = nodes.get(id(self))
        paused = getattr(_state, "paused", False)
        if node is not None and name in node[1] and not paused and not is_dataclass(value):
            reads.add(node[0] + name)
        return value

    classes = {cls for _, _, cls in nodes.values()}
    for cls in classes:
        cls.__getattribute__ = getattribute  # type: ignore[method-assign]
    try:
        yield reads
    finally:
        for cls in classes:
            del cls.__getattribute__


@contextmanager
def reads_to_env_folder(stage: str, cfg: Any) -> Iterator[None]:
    """``recording_reads`` into ``$ZAYA_CONFIG_READS/<stage>.json`` when that variable is set."""
    folder = os.environ.get(ENV)
    if not folder:
        yield
        return
    with recording_reads(cfg) as reads:
        try:
            yield
        finally:
            Path(folder).mkdir(parents=True, exist_ok=True)
            text = json.dumps(sorted(reads), indent=0) + "\n"
            (Path(folder) / f"{stage}.json").write_text(text, encoding="utf-8")

"""The curation chain: ``data.curate.steps`` (Hydra) → validated steps → datatrove passes.

``data.curate.steps`` maps a step id to ``{type, order, enabled, **params}``; ``type`` defaults to the id, and
steps run by increasing ``order``. The params are the keyword arguments of the class behind the type (a
datatrove step, one of ours in ``filters.py``, or a dedup's config dataclass), checked here against its
signature and the types of its defaults, so a typo or a wrong type fails before any worker starts, naming
``data.curate.steps.<id>.<param>``.

Format steps edit text, filter steps drop documents, and a dedup step splits the chain into passes (one
datatrove executor run each): its signature step ends one pass, its middle passes (find duplicates,
buckets, clusters) run alone, and its filter starts the next pass, so the data is read once per dedup::

    pass_0:  reader → formats/filters… → writer(shards_0) → dedup₁ signature
    dedup₁ middle passes
    pass_1:  reader(shards_0) → dedup₁ filter → formats/filters… → writer(shards_1) → dedup₂ signature
    …
    pass_n:  reader → dedupₙ filter → formats/filters… → writer(curated)

Every filter and dedup writes what it drops to ``removed/<step id>/`` with its step id and reason.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zaya_pipeline.errors import ConfigError

KEY = "data.curate.steps"
READ, WRITE = "read", "write"  # pseudo step ids: where documents enter and leave the chain


@dataclass(frozen=True)
class StepType:
    target: str  # "module:Class" of the step, or of the dedup's config dataclass for kind="dedup"
    kind: str  # "format" (edits text, never drops), "filter" (drops), "dedup" (splits the chain into passes)
    tokenizer: bool = False  # gets our cached EnglishTokenizer as ``language`` (datatrove's word splitter)
    hidden: tuple[str, ...] = ()  # constructor arguments the chain sets itself; "*" = all
    reason: str = ""  # dedups: the drop reason (datatrove's dedup filters name none)


_F = "datatrove.pipeline.filters"
_D = "datatrove.pipeline.dedup"
STEP_TYPES: dict[str, StepType] = {
    "normalize": StepType("zaya_pipeline.data.filters:TextNormalizer", "format"),
    "pii": StepType("datatrove.pipeline.formatters:PIIFormatter", "format"),
    "url": StepType("zaya_pipeline.data.filters:OfflineURLFilter", "filter"),
    "length": StepType("zaya_pipeline.data.filters:LengthFilter", "filter"),
    "language": StepType("zaya_pipeline.data.filters:LocalLanguageFilter", "filter"),
    "gopher_repetition": StepType(f"{_F}:GopherRepetitionFilter", "filter", tokenizer=True),
    "gopher_quality": StepType(f"{_F}:GopherQualityFilter", "filter", tokenizer=True),
    "c4_quality": StepType(f"{_F}:C4QualityFilter", "filter", tokenizer=True),
    "fineweb_quality": StepType(f"{_F}:FineWebQualityFilter", "filter", tokenizer=True),
    "exact_dedup": StepType(
        f"{_D}.exact_dedup:ExactDedupConfig", "dedup", hidden=("*",), reason="exact_duplicate"
    ),
    "minhash_dedup": StepType(
        f"{_D}.minhash:MinhashConfig", "dedup", hidden=("norm_config",), reason="near_duplicate"
    ),
    "sentence_dedup": StepType(
        f"{_D}.sentence_dedup:SentDedupConfig",
        "dedup",
        hidden=("norm_config", "only_dedup_in_index"),
        reason="sentence_duplicates",
    ),
}
ALWAYS_HIDDEN = ("exclusion_writer", "language", "hash_config", "content_getter", "document_priority")


@dataclass
class ChainStep:
    id: str
    type: str
    order: int
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return STEP_TYPES[self.type].kind

    @property
    def key(self) -> str:
        return f"{KEY}.{self.id}"


# --- parsing and validation --------------------------------------------------------------------------------


def _load(target: str) -> Any:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def accepted_params(type_: str) -> dict[str, Any]:
    """Parameter → default (``inspect.Parameter.empty`` when required) that a step of ``type_`` accepts."""
    t = STEP_TYPES[type_]
    if "*" in t.hidden:
        return {}
    obj = _load(t.target)
    if dataclasses.is_dataclass(obj):
        params = {
            f.name: f.default if f.default is not dataclasses.MISSING else inspect.Parameter.empty
            for f in dataclasses.fields(obj)
        }
    else:
        params = {n: p.default for n, p in inspect.signature(obj.__init__).parameters.items() if n != "self"}
    return {n: d for n, d in params.items() if n not in (*ALWAYS_HIDDEN, *t.hidden)}


def _type_ok(value: Any, default: Any) -> bool:
    if default is inspect.Parameter.empty or default is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(default, list | tuple):
        return isinstance(value, list | tuple)
    return isinstance(value, type(default))


def parse_steps(steps: dict[str, Any]) -> list[ChainStep]:
    """The enabled steps in run order, their params checked; raises ``ConfigError`` naming the bad key."""
    parsed, orders = [], {}
    for step_id, raw in steps.items():
        key = f"{KEY}.{step_id}"
        if not isinstance(raw, dict):
            raise ConfigError(f"{key}={raw!r}: a step is a mapping {{type, order, enabled, ...params}}")
        params = dict(raw)
        type_ = params.pop("type", step_id)
        if type_ not in STEP_TYPES:
            raise ConfigError(f"{key}.type={type_!r} is not a step type; known: {', '.join(STEP_TYPES)}")
        order, enabled = params.pop("order", None), params.pop("enabled", True)
        if not isinstance(order, int) or isinstance(order, bool):
            raise ConfigError(
                f"{key}.order={order!r}: every step needs an integer order (steps run by order)"
            )
        if not isinstance(enabled, bool):
            raise ConfigError(f"{key}.enabled={enabled!r} must be true or false")
        if order in orders:
            raise ConfigError(f"{key}.order={order} is also the order of {KEY}.{orders[order]}")
        orders[order] = step_id
        accepted = accepted_params(type_)
        for name, value in params.items():
            if name not in accepted:
                raise ConfigError(
                    f"{key}.{name} is not a parameter of a {type_} step; "
                    f"accepted: {', '.join(accepted) or 'none'}"
                )
            if not _type_ok(value, accepted[name]):
                raise ConfigError(
                    f"{key}.{name}={value!r}: expected a {type(accepted[name]).__name__} like its default "
                    f"{accepted[name]!r}"
                )
        step = ChainStep(step_id, type_, order, params)
        _check_values(step)
        if enabled:
            parsed.append(step)
    if not parsed:
        raise ConfigError(f"{KEY}: no enabled step (the chain would copy its input)")
    return sorted(parsed, key=lambda s: s.order)


def _at_least(step: ChainStep, minimum: float, *names: str) -> None:
    for n in names:
        if n in step.params and step.params[n] < minimum:
            raise ConfigError(f"{step.key}.{n}={step.params[n]} must be >= {minimum}")


def _check_values(step: ChainStep) -> None:
    """What the types cannot say; files are checked here too, so a bad path fails before any worker starts."""
    p = step.params
    if step.type == "minhash_dedup":
        _at_least(step, 1, "n_grams", "num_buckets", "hashes_per_bucket")
    elif step.type == "sentence_dedup":
        _at_least(step, 1, "n_sentences")
    elif step.type == "length":
        _at_least(step, 0, "min_chars", "max_chars", "min_words", "max_words")
    elif step.type == "language":
        threshold = p.get("language_threshold")  # absent: the filter's own default
        if threshold is not None and not 0 <= threshold <= 1:
            raise ConfigError(f"{step.key}.language_threshold={p['language_threshold']} must be in [0, 1]")
        langs = p.get("languages") or []
        if not isinstance(langs, list | tuple) or not all(isinstance(x, str) for x in langs):
            raise ConfigError(f"{step.key}.languages={langs!r}: a list of ISO 639-1 codes like [en, de]")
        from zaya_pipeline.data.filters import lid_model_path

        lid_model_path(p.get("model_path", ""), f"{step.key}.model_path")
    elif step.type == "url" and p.get("blocklist_file") and not Path(p["blocklist_file"]).is_file():
        raise ConfigError(f"{step.key}.blocklist_file={p['blocklist_file']!r} is not a file")
    elif step.type == "normalize" and p.get("form", "NFC") not in ("", "NFC", "NFKC", "NFD", "NFKD"):
        raise ConfigError(f"{step.key}.form={p['form']!r}: one of NFC, NFKC, NFD, NFKD or ''")


# --- building datatrove objects ----------------------------------------------------------------------------


def reader(folder: Path) -> Any:
    from datatrove.pipeline.readers import JsonlReader

    return JsonlReader(str(folder), glob_pattern="*.jsonl.gz", recursive=False, add_file_path=False)


def writer(folder: Path, adapter: Any = None) -> Any:
    from datatrove.pipeline.writers import JsonlWriter

    return JsonlWriter(str(folder), output_filename="${rank}.jsonl.gz", adapter=adapter)


def exclusion(removed: Path, step: str, reason: str = "") -> Any:
    """The writer of what ``step`` drops: ``removed/<step>/<rank>.jsonl.gz``, step and reason in metadata."""
    from zaya_pipeline.data.datatrove_parts import removed_record

    return writer(removed / step, functools.partial(removed_record, step=step, reason=reason))


def build_step(step: ChainStep, removed: Path, tok: Any) -> Any:
    """A format step (wrapped to count its edits) or a filter (with an exclusion writer)."""
    from zaya_pipeline.data.filters import CountEdits

    t = STEP_TYPES[step.type]
    kwargs = dict(step.params)
    if step.type == "pii":  # datatrove cycles through a tuple of replacements
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
    if step.type == "gopher_repetition":  # n-gram thresholds: YAML lists of [n, fraction] pairs
        kwargs = {k: tuple(map(tuple, v)) if k.endswith("n_grams") else v for k, v in kwargs.items()}
    if step.type == "fineweb_quality" and "stop_chars" in kwargs:
        kwargs["stop_chars"] = tuple(kwargs["stop_chars"])
    if t.tokenizer:
        kwargs["language"] = tok
    if t.kind == "format":
        return CountEdits(_load(t.target)(**kwargs))
    return _load(t.target)(exclusion_writer=exclusion(removed, step.id), **kwargs)


@dataclass
class Pass:
    """One executor run. ``accounted`` maps a pipeline index to the (step id, type) it is counted as."""

    name: str
    pipeline: list
    tasks: int
    accounted: dict[int, tuple[str, str]] = field(default_factory=dict)


@dataclass
class Dedup:
    """A dedup split across passes: signatures at the end of one pass, a filter at the start of the next."""

    signature: Any
    middle: list[Pass]
    filter: Any


def build_dedup(step: ChainStep, work: Path, removed: Path, tok: Any) -> Dedup:
    build = {"exact_dedup": _exact, "minhash_dedup": _minhash, "sentence_dedup": _sentence}[step.type]
    return build(step, work / step.id, exclusion(removed, step.id, STEP_TYPES[step.type].reason), tok)


def _exact(step: ChainStep, work: Path, excluded: Any, tok: Any) -> Dedup:
    from datatrove.pipeline.dedup.exact_dedup import (
        ExactDedupConfig,
        ExactDedupFilter,
        ExactDedupSignature,
        ExactFindDedups,
    )

    from zaya_pipeline.data.datatrove_parts import normalized_text

    config = ExactDedupConfig(content_getter=normalized_text)
    sigs, dups = str(work / "sigs"), str(work / "dups")
    return Dedup(
        ExactDedupSignature(sigs, config=config, finder_workers=1),
        [Pass(f"{step.id}_find", [ExactFindDedups(sigs, dups, config=config)], 1)],
        ExactDedupFilter(dups, config=config, exclusion_writer=excluded),
    )


def _minhash(step: ChainStep, work: Path, excluded: Any, tok: Any) -> Dedup:
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )

    config = MinhashConfig(**step.params)
    sigs, buckets, clusters = str(work / "sigs"), str(work / "buckets"), str(work / "clusters")
    return Dedup(
        MinhashDedupSignature(sigs, config=config, language=tok),
        [
            Pass(
                f"{step.id}_buckets", [MinhashDedupBuckets(sigs, buckets, config=config)], config.num_buckets
            ),
            Pass(
                f"{step.id}_cluster",
                [MinhashDedupCluster(buckets, clusters, config=config, save_cluster_size=True)],
                1,
            ),
        ],
        MinhashDedupFilter(clusters, exclusion_writer=excluded, load_cluster_sizes=True),
    )


def _sentence(step: ChainStep, work: Path, excluded: Any, tok: Any) -> Dedup:
    from datatrove.pipeline.dedup.sentence_dedup import (
        SentDedupConfig,
        SentenceDedupFilter,
        SentenceDedupSignature,
        SentenceFindDedups,
    )

    from zaya_pipeline.data.filters import SentenceDedupDrops

    config = SentDedupConfig(**step.params)
    sigs, dups = str(work / "sigs"), str(work / "dups")
    return Dedup(
        SentenceDedupSignature(sigs, finder_workers=1, config=config, language=tok),
        [Pass(f"{step.id}_find", [SentenceFindDedups(sigs, dups, config=config)], 1)],
        SentenceDedupDrops(SentenceDedupFilter(dups, config=config, language=tok), excluded),
    )


def build_passes(
    steps: list[ChainStep], tasks: int, raw: Path, work: Path, curated: Path, removed: Path
) -> list[Pass]:
    """Every executor run of the chain, in order, named ``<index>_<what>``."""
    from zaya_pipeline.data.datatrove_parts import EnglishTokenizer, curated_record
    from zaya_pipeline.data.filters import EnsureShard

    tok = EnglishTokenizer()  # one instance for every step of a pass: its word lists are cached per instance
    passes: list[Pass] = []
    head: list[tuple[tuple[str, str] | None, Any]] = []  # the accounted steps after the current pass's reader
    source, dedups = raw, 0
    for step in steps:
        if step.kind != "dedup":
            head.append(((step.id, step.type), build_step(step, removed, tok)))
            continue
        dedup = build_dedup(step, work, removed, tok)
        shards = work / f"shards_{dedups}"
        read = ((READ, READ), reader(source))
        tail = [(None, writer(shards)), (None, EnsureShard(str(shards))), (None, dedup.signature)]
        passes.append(_pass(f"pass_{dedups}", [read, *head, *tail], tasks))
        passes.extend(dedup.middle)
        source, head, dedups = shards, [((step.id, step.type), dedup.filter)], dedups + 1
    read, write = ((READ, READ), reader(source)), ((WRITE, WRITE), writer(curated, curated_record))
    passes.append(_pass(f"pass_{dedups}", [read, *head, write], tasks))
    return [dataclasses.replace(p, name=f"{i:02d}_{p.name}") for i, p in enumerate(passes)]


def _pass(name: str, steps: list[tuple[tuple[str, str] | None, Any]], tasks: int) -> Pass:
    return Pass(name, [s for _, s in steps], tasks, {i: a for i, (a, _) in enumerate(steps) if a})

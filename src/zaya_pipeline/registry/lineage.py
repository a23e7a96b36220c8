"""What a registered version is tagged with, and whether it becomes the champion.

* Lineage tags: the weights' sha256 (also the idempotency key), the DVC-locked hashes of the token shards
  and the tokenizer (``dvc.lock``, when the stage ran under DVC), the dataset token counts and the sha256 of
  the resolved config (the config itself is an artifact of the version).
* Aliases: every new version is the ``candidate``; it is promoted to ``champion`` only when it beats the
  current champion on ``registry.promote_metric`` by more than ``registry.promote_margin`` (the first
  version always is). The decision and its reason are a tag of the version and a line in the log.
* Completion: a version is created with its lineage tags and ``registration=pending`` in one step; the tag
  becomes ``complete`` once its aliases are set. A pending version was interrupted (kill -9): the next
  registration of the same weights completes it instead of creating another.
"""

from __future__ import annotations

from pathlib import Path

from zaya_pipeline.config import RegistryConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.utils import get_logger

log = get_logger("register")

CANDIDATE, CHAMPION = "candidate", "champion"
WEIGHTS_TAG = "weights_sha256"
REGISTRATION_TAG, PENDING, COMPLETE = "registration", "pending", "complete"


def dvc_lock_hashes(lock: Path, outputs: dict[str, str]) -> dict[str, str]:
    """``{tag: md5}`` of the stage outputs ``{tag: path}`` recorded in ``dvc.lock`` (missing: left out)."""
    if not lock.is_file():
        return {}
    import yaml

    stages = (yaml.safe_load(lock.read_text()) or {}).get("stages", {})
    recorded = {o["path"]: o.get("md5") for s in stages.values() for o in s.get("outs", []) if "path" in o}
    return {tag: recorded[path] for tag, path in outputs.items() if recorded.get(path)}


def metric_value(metrics: dict, key: str) -> float:
    """``metrics[key]``, with dots descending into nested dicts (``tasks.arc_easy.acc``)."""
    value = metrics
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ConfigError(f"registry.promote_metric={key!r} is not in metrics.json")
        value = value[part]
    if not isinstance(value, int | float):
        raise ConfigError(f"registry.promote_metric={key!r} is not a number in metrics.json")
    return float(value)


def existing_version(client, name: str, weights_sha256: str):
    """The registered version of ``name`` holding exactly these weights, if there is one."""
    for version in client.search_model_versions(f"name='{name}'"):
        if version.tags.get(WEIGHTS_TAG) == weights_sha256:
            return version
    return None


def is_pending(version) -> bool:
    """Whether ``version`` was created but its registration did not finish (versions from before the
    ``registration`` tag have none: they are complete)."""
    return version.tags.get(REGISTRATION_TAG) == PENDING


def complete_registration(client, cfg: RegistryConfig, name: str, version: str, value: float) -> dict:
    """Set the aliases of a created ``version`` (:func:`apply_aliases`), then mark it ``complete``."""
    aliases = apply_aliases(client, cfg, name, version, value)
    client.set_model_version_tag(name, version, REGISTRATION_TAG, COMPLETE)
    return aliases


def decide_promotion(
    cfg: RegistryConfig, value: float, champion: tuple[str, float] | None
) -> tuple[bool, str]:
    """(promote?, reason) for a candidate scoring ``value`` against ``champion`` = (version, value)."""
    if cfg.promote_mode not in ("min", "max"):
        raise ConfigError(f"registry.promote_mode must be 'min' or 'max', got {cfg.promote_mode!r}")
    metric, margin = cfg.promote_metric, cfg.promote_margin
    if champion is None:
        return True, f"no champion yet ({metric} = {value:.6g})"
    version, best = champion
    gain = best - value if cfg.promote_mode == "min" else value - best
    verdict = "beats" if gain > margin else "does not beat"
    reason = (
        f"{metric} {value:.6g} vs champion v{version} {best:.6g}: {verdict} it by more than the margin "
        f"{margin:g} ({cfg.promote_mode} is better, gain {gain:.6g})"
    )
    return gain > margin, reason


def apply_aliases(client, cfg: RegistryConfig, name: str, version: str, value: float) -> dict:
    """Set ``candidate`` on ``version`` and decide ``champion``; returns {champion, promoted, decision}."""
    from mlflow.exceptions import MlflowException

    client.set_registered_model_alias(name, CANDIDATE, version)
    try:
        current = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        current = None
    champion = None
    current_version = None if current is None else str(current.version)
    if current_version is not None and current_version != version:
        tag = current.tags.get(f"promote.{cfg.promote_metric}")
        if tag is None:
            raise ConfigError(
                f"champion v{current.version} of {name} has no {cfg.promote_metric} tag to compare with: "
                f"registry.promote_metric changed? Set the alias by hand or keep the old metric"
            )
        champion = (current_version, float(tag))
    if current_version == version:
        return {"champion": version, "promoted": False, "decision": "already the champion"}
    promote, reason = decide_promotion(cfg, value, champion)
    if promote:
        client.set_registered_model_alias(name, CHAMPION, version)
    decision = ("promoted to champion: " if promote else "kept as candidate: ") + reason
    client.set_model_version_tag(name, version, "promotion", decision)
    log.info("%s v%s %s", name, version, decision)
    return {"champion": version if promote else champion[0], "promoted": promote, "decision": decision}

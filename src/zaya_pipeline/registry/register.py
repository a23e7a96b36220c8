"""``zaya register``: log the trained model to its MLflow run as a pyfunc and register a version of it.

The logged model holds model.pt (and the same weights as model.safetensors + model_config.json, for other
frameworks), tokenizer.json, the tokenizer's meta.json, the resolved config (config.yaml), the eval metrics
(metrics.json), MODEL_CARD.md and a copy of the ``zaya_pipeline`` package (so a version keeps loading after
the code moves on), with pinned pip requirements (no slow requirement inference).

Idempotent: weights already registered under the model name (same sha256) create no new version. A new
version is created with its lineage tags, description and ``registration=pending`` in one step, then gets the
aliases of :mod:`zaya_pipeline.registry.lineage` (``candidate``, and ``champion`` when it beats the current
one) and ``registration=complete``. Atomic from the user's view: an error or Ctrl-C after the version exists
deletes it (and its logged model) again; after a kill -9 the next run of the same weights completes the
pending version, and removes the unfinished logged models of a kill before it. The training run is only read:
its status and end time never change, whatever happens here. A store or artifact folder that cannot be
written is a one-line error naming it, before anything is created.

Refused before anything is created: metrics that score other weights than ``model.pt`` (evaluate's
``model_sha256``), name none, or hold non-finite figures. Registrations of one store on one machine run one at
a time (:func:`registration_lock`), so two at once of the same weights make one version.

Writes ``<reports>/registry.json``: {model_name, version, model_uri ("models:/<name>/<version>"), run_id,
tracking_uri, registry_uri, logged_model_uri, reused, champion, promoted, decision}.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from importlib.metadata import version as dist_version
from pathlib import Path

from zaya_pipeline.config import ZayaConfig, as_dict
from zaya_pipeline.errors import ConfigError, DataError, first_line
from zaya_pipeline.model.saved_model import save_safetensors
from zaya_pipeline.registry.hf_export import write_export
from zaya_pipeline.registry.lineage import (
    PENDING,
    REGISTRATION_TAG,
    WEIGHTS_TAG,
    complete_registration,
    dvc_lock_hashes,
    existing_version,
    is_pending,
    metric_value,
)
from zaya_pipeline.tracking import (
    TrackingError,
    check_artifact_location,
    check_store_writable,
    get_run,
    read_run_info,
    tracking_uri,
    using_tracking_uri,
)
from zaya_pipeline.utils import file_sha256, get_logger, read_json, write_json

log = get_logger("register")

REGISTRY_FILE = "registry.json"
ARTIFACT_NAME = "model"
# What ZayaGenerator imports at load time; pinned to this environment's versions.
REQUIREMENTS = ("torch", "tokenizers", "numpy", "pandas", "mlflow")
METRIC_TAGS = ("val_loss", "perplexity", "bits_per_byte", "tokens")
ENTRY_FILE = Path(__file__).with_name("pyfunc_entry.py")


def pip_requirements() -> list[str]:
    """``name==version`` of each requirement, without local labels (``2.13.0+cpu`` → ``2.13.0``)."""
    return [f"{name}=={dist_version(name).split('+')[0]}" for name in REQUIREMENTS]


def _git(cwd: str | Path, *args: str) -> str:
    cmd = ["git", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True).stdout.strip()


def git_commit(cwd: str | Path = ".") -> tuple[str | None, bool]:
    """(HEAD commit, whether tracked files differ from it), or (None, False) outside a git repository."""
    try:
        commit = _git(cwd, "rev-parse", "HEAD")
        dirty = bool(_git(cwd, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None, False
    return commit, dirty


def _inputs(cfg: ZayaConfig) -> dict[str, Path]:
    train, tok, reports = Path(cfg.paths.train), Path(cfg.paths.tokenizer), Path(cfg.paths.reports)
    files = {
        "model": (train / "model.pt", "zaya train"),
        "tokenizer": (tok / "tokenizer.json", "zaya tokenizer"),
        "tokenizer_meta": (tok / "meta.json", "zaya tokenizer"),
        "metrics": (reports / "metrics.json", "zaya evaluate"),
    }
    for path, stage in files.values():
        if not path.is_file():
            raise DataError(f"{path} is missing: run `{stage}` first")
    return {name: path for name, (path, _) in files.items()}


def _write_config(cfg: ZayaConfig, path: Path) -> Path:
    from omegaconf import OmegaConf

    path.write_text(OmegaConf.to_yaml(OmegaConf.create(as_dict(cfg))), encoding="utf-8")
    return path


def _log_model(client, uri: str, run, weights: str, artifacts: dict[str, str], registry_cfg) -> str:
    """Log the pyfunc model as a logged model of the training ``run``; returns its id.

    Not inside ``mlflow.start_run(run_id=...)``: that sets the finished training run RUNNING while the model
    uploads, then ends it again (a new end time; FAILED on an error; RUNNING for good after a kill -9). The
    logged model is created first, with the run as its source and the weights' hash as a tag, and the files
    are logged into it; one whose upload fails is deleted at once, one left by a kill is found by the next run
    (:func:`_discard_unfinished`).
    """
    import mlflow
    import pandas as pd
    from mlflow.entities import LoggedModelOutput
    from mlflow.exceptions import MlflowException

    import zaya_pipeline
    from zaya_pipeline.registry.pyfunc import serving_config, signature

    run_id = run.info.run_id
    model = _call_store(
        uri,
        lambda: client.create_logged_model(
            run.info.experiment_id,
            name=ARTIFACT_NAME,
            source_run_id=run_id,
            tags={WEIGHTS_TAG: weights},
            params=run.data.params,
        ),
    )
    try:
        with using_tracking_uri(uri):  # log_model's own calls (finalize) go through the fluent API
            mlflow.pyfunc.log_model(
                name=ARTIFACT_NAME,
                model_id=model.model_id,
                python_model=str(ENTRY_FILE),  # executed at load time, never imported here
                artifacts=artifacts,
                code_paths=[str(Path(zaya_pipeline.__file__).parent)],
                signature=signature(),
                # MLflow runs this example through the saved model (load + predict) before logging it: one new
                # token proves the model loads and generates, at the least cost.
                input_example=(pd.DataFrame({"prompt": ["The database"]}), {"max_new_tokens": 1}),
                pip_requirements=pip_requirements(),
                model_config=serving_config(registry_cfg),  # the caps of a served request
            )
        client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])  # listed under the run
    except BaseException as exc:
        _discard(f"logged model {model.model_id}", lambda: client.delete_logged_model(model.model_id))
        if isinstance(exc, OSError):
            where, why = model.artifact_location, exc.strerror or exc
            raise TrackingError(f"cannot write the model's artifacts to {where}: {why}") from None
        if isinstance(exc, MlflowException):
            why = first_line(exc)
            raise TrackingError(f"cannot log the model to run {run_id} in {uri}: {why}") from None
        raise
    return model.model_id


def _discard_unfinished(client, run, weights: str) -> None:
    """Delete the logged models of these weights from ``run`` that never finished uploading (PENDING after a
    kill -9, FAILED after an error MLflow caught): no version can hold them."""
    from mlflow.entities import LoggedModelStatus

    query = f"tags.`{WEIGHTS_TAG}` = '{weights}' AND source_run_id = '{run.info.run_id}'"
    for model in client.search_logged_models([run.info.experiment_id], filter_string=query):
        if model.status != LoggedModelStatus.READY:
            log.info("removing the unfinished logged model %s of an interrupted registration", model.model_id)
            client.delete_logged_model(model.model_id)


def _create_version(client, name: str, run_id: str, model_id: str, tags: dict, description: str) -> str:
    """A new version of ``name`` (created if missing) with its tags and description, in one step."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
            raise
    tags = tags | {REGISTRATION_TAG: PENDING}
    source = f"models:/{model_id}"
    with using_tracking_uri(client.tracking_uri):  # MLflow resolves the models:/ source with the fluent API
        version = client.create_model_version(
            name, source, run_id, tags, description=description, model_id=model_id
        )
    log.info("created %s v%s (pending until its aliases are set)", name, version.version)
    return str(version.version)


def _discard(what: str, delete) -> None:
    """Undo a half-done registration; if that fails too, say so (the next run completes or removes it)."""
    try:
        delete()
    except Exception as exc:
        log.warning("could not remove %s of the failed registration: %s", what, first_line(exc))


def _model_config(path: Path):
    from zaya_pipeline.model.saved_model import read_model_file

    return read_model_file(path, weights=False)[0]  # the weights are not read, only the config


def lineage_tags(cfg, metrics, weights, config_sha, commit, dirty, value) -> dict[str, str]:
    """Version tags: eval metrics, weights / config hashes, DVC-locked data hashes, token counts, git."""
    tags = {f"eval.{k}": str(metrics[k]) for k in METRIC_TAGS if k in metrics}
    for task, m in metrics.get("tasks", {}).items():
        tags[f"eval.{task}.acc"] = str(m["acc"])
    tags |= {
        WEIGHTS_TAG: weights,
        "config_sha256": config_sha,
        f"promote.{cfg.registry.promote_metric}": str(value),
    }
    locked = {"lineage.tokens_md5": cfg.paths.tokens, "lineage.tokenizer_md5": cfg.paths.tokenizer}
    tags |= dvc_lock_hashes(Path("dvc.lock"), locked)
    tags |= {f"data.{split}_tokens": str(n) for split, n in token_counts(cfg).items()}
    if commit:
        tags |= {"git_commit": commit, "git_dirty": str(dirty).lower()}
    return tags


def token_counts(cfg: ZayaConfig) -> dict[str, int]:
    """Tokens per split from the tokenize stage's report (``<reports>/tokenize.json``); {} without it."""
    report = Path(cfg.paths.reports) / "tokenize.json"
    splits = read_json(report).get("splits", {}) if report.is_file() else {}
    return {s: int(v["tokens"]) for s, v in splits.items() if isinstance(v, dict) and "tokens" in v}


def _card_context(cfg: ZayaConfig) -> tuple[dict, dict]:
    """(token counts per split, training summary) for the model card, from the stage reports if present."""
    training = {"optimizer": cfg.train.optim.name, "schedule": cfg.train.schedule.name}
    report = Path(cfg.paths.reports) / "train.json"
    if report.is_file():
        training |= {k: v for k, v in read_json(report).items() if k in ("steps", "tokens_seen")}
    return token_counts(cfg), training


def _call_store(uri: str, fn):
    from mlflow.exceptions import MlflowException

    try:
        return fn()
    except MlflowException as exc:
        raise TrackingError(f"the model registry at {uri} failed: {first_line(exc)}") from None


def _result(name, version, run_id, uri, registry_uri, logged_model_uri) -> dict:
    return {
        "model_name": name,
        "version": str(version),
        "model_uri": f"models:/{name}/{version}",
        "run_id": run_id,
        "tracking_uri": uri,
        "registry_uri": registry_uri,
        "logged_model_uri": logged_model_uri,
    }


def _registry_uri(uri: str) -> str:
    import mlflow

    with using_tracking_uri(uri):
        return mlflow.get_registry_uri()


def _package(cfg: ZayaConfig, tmp: Path, inputs, metrics, model_cfg, run_id, weights, value):
    """(artifacts, version tags, model card) of a new version; derived files are written into ``tmp``."""
    from zaya_pipeline.registry.model_card import model_card

    commit, dirty = git_commit()
    artifacts = {key: str(path) for key, path in inputs.items()}
    config = _write_config(cfg, tmp / "config.yaml")
    artifacts["config"] = str(config)
    card = model_card(model_cfg, metrics, run_id, commit, *_card_context(cfg))
    (tmp / "MODEL_CARD.md").write_text(card, encoding="utf-8")
    artifacts["model_card"] = str(tmp / "MODEL_CARD.md")
    weights_st, config_json = save_safetensors(inputs["model"], tmp)
    artifacts |= {"safetensors": str(weights_st), "model_config": str(config_json)}
    hf_files = {
        **{k: inputs[k] for k in ("model", "tokenizer", "tokenizer_meta")},
        "card": tmp / "MODEL_CARD.md",
    }
    artifacts["hf"] = str(write_export(hf_files, tmp / "hf", f"{cfg.registry.model_name} (run {run_id})"))
    tags = lineage_tags(cfg, metrics, weights, file_sha256(config), commit, dirty, value)
    return artifacts, tags, card


def _undo(client, name: str, weights: str, model_id: str | None) -> None:
    """Remove what an interrupted or failed registration created: the pending version of these weights, if
    it got as far, and its logged model ``model_id`` (the version's source, ``models:/<model_id>``)."""
    version = existing_version(client, name, weights)
    if version is not None and is_pending(version):
        client.delete_model_version(name, version.version)
    if model_id:
        client.delete_logged_model(model_id)


def check_metrics(metrics: dict, weights: str, inputs: dict[str, Path]) -> None:
    """The metrics must score exactly these weights (evaluate's ``model_sha256``) and be finite numbers: a
    champion is a model whose figures were measured, on it."""
    import math

    model, path = inputs["model"], inputs["metrics"]
    scored = metrics.get("model_sha256")
    if scored != weights:
        what = "names no model" if scored is None else f"scores other weights ({str(scored)[:12]}…)"
        raise DataError(f"{path} {what}, not {model} ({weights[:12]}…): run `zaya evaluate` first")
    bad = [
        k for k in METRIC_TAGS if not isinstance(metrics.get(k), int | float) or not math.isfinite(metrics[k])
    ]
    if bad:
        raise DataError(f"{path}: {', '.join(f'{k}={metrics.get(k)}' for k in bad)} is not a finite number")


@contextlib.contextmanager
def registration_lock(uri: str):
    """One registration at a time per store on this machine (an exclusive ``flock`` on a file named after
    the store, in the temp folder): two ``zaya register`` of the same weights make one version."""
    import fcntl
    import hashlib

    key = hashlib.sha256(uri.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"zaya-register-{key}.lock"
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another registration in %s to finish", uri)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def register(cfg: ZayaConfig) -> dict:
    start = time.perf_counter()
    out = Path(cfg.paths.reports) / REGISTRY_FILE  # replaced at the end: a failed run leaves the last one
    if not cfg.registry.model_name:
        raise ConfigError("registry.model_name must not be empty")
    run_info = read_run_info(cfg.paths.train)
    run_id, uri = run_info["run_id"], run_info["tracking_uri"]
    if (configured := tracking_uri(cfg.registry)) != uri:
        log.warning("the training run lives in %s (run.json), not in %s: registering there", uri, configured)
    inputs = _inputs(cfg)
    client, run = get_run(uri, run_id)
    metrics = read_json(inputs["metrics"])
    value = metric_value(metrics, cfg.registry.promote_metric)  # a bad metric name fails before any logging
    model_cfg = _model_config(inputs["model"])
    name, weights = cfg.registry.model_name, file_sha256(inputs["model"])
    check_metrics(metrics, weights, inputs)
    with registration_lock(uri):  # a second register of the same store waits, then finds the version
        existing = _call_store(uri, lambda: existing_version(client, name, weights))
        if existing is not None and not is_pending(existing):
            log.info("these weights are already %s v%s: no new version", name, existing.version)
            result = _result(name, existing.version, run_id, uri, uri, existing.source) | {"reused": True}
            write_json(out, result)
            return {"model_uri": result["model_uri"], "run_id": run_id, "reused": True}
        check_store_writable(uri)  # what follows writes: fail before anything is created
        if existing is None:
            experiment = _call_store(uri, lambda: client.get_experiment(run.info.experiment_id))
            check_artifact_location(experiment.artifact_location)
            _call_store(uri, lambda: _discard_unfinished(client, run, weights))
        else:
            log.warning("%s v%s of these weights was interrupted: completing it", name, existing.version)

        model_id = None
        try:  # no half-registered version: one without its aliases would look complete in the UI
            if existing is None:
                with tempfile.TemporaryDirectory(prefix="zaya-register-") as tmp:
                    package = _package(cfg, Path(tmp), inputs, metrics, model_cfg, run_id, weights, value)
                    artifacts, tags, card = package
                    model_id = _log_model(client, uri, run, weights, artifacts, cfg.registry)
                version = _call_store(
                    uri, lambda: _create_version(client, name, run_id, model_id, tags, card)
                )
            else:
                version, model_id = str(existing.version), existing.source.removeprefix("models:/")
            aliases = _call_store(
                uri, lambda: complete_registration(client, cfg.registry, name, version, value)
            )
        except BaseException:
            _discard(f"the registration of {name}", lambda: _undo(client, name, weights, model_id))
            raise
        result = _result(name, version, run_id, uri, _registry_uri(uri), f"models:/{model_id}")
        result |= {"reused": False, **aliases}
        write_json(out, result)
        seconds = round(time.perf_counter() - start, 2)
        log.info("registered %s (run %s) in %.1fs", result["model_uri"], run_id, seconds)
        return {
            "model_uri": result["model_uri"],
            "run_id": run_id,
            "champion": result["champion"],
            "promoted": result["promoted"],
            "seconds": seconds,
        }

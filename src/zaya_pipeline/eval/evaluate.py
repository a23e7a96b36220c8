"""``zaya evaluate``: score the trained model on the held-out split and record the figures.

Writes the DVC metrics file ``<reports>/metrics.json``::

    {val_loss, perplexity, bits_per_byte, tokens, bytes, windows, seq_len, model_sha256,
     unigram_val_nats_per_token, unigram_val_bits_per_byte,
     tasks: {<task>: {n, acc, acc_norm, acc_per_byte (each with _stderr), chance}}, tasks_above_chance}

(loss in nats/token; the unigram figures are the tokenize stage's baseline; ``tasks`` are the zero-shot
multiple-choice tasks of ``eval.tasks``, the first ``eval.task_limit`` documents of each, and
``tasks_above_chance`` counts those whose accuracy exceeds chance by more than its standard error) and logs
the same numbers, prefixed ``eval/`` (``eval/tasks/<task>/acc``, ...), to the training run named in
``<train>/run.json``. ``model_sha256`` binds the figures to the exact weights scored: ``register`` refuses
metrics of other weights. The reports (metrics, samples, task plots) are staged and moved in together at the
end; weights holding NaN or Inf are refused before anything is written.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from zaya_pipeline.config import ZayaConfig
from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.eval.metrics import EvalResult, evaluate_lm
from zaya_pipeline.eval.token_bytes import load_byte_lengths
from zaya_pipeline.tracking import TrackingError, get_run, read_run_info
from zaya_pipeline.utils import file_sha256, get_logger, staged_files, write_json

log = get_logger("eval")

METRICS_FILE = "metrics.json"
SAMPLES_FILE = "samples.json"
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "seed": 0}  # the "sampled" generation samples


def write_samples(cfg: ZayaConfig, model, tokenizer, token_meta: dict, path: Path) -> Path:
    """Greedy and sampled continuations of ``eval.sample_prompts`` as JSON (fixed seed: reproducible)."""
    from zaya_pipeline.model.generate import continue_prompts

    prompts, n, eos = list(cfg.eval.sample_prompts), cfg.eval.sample_tokens, int(token_meta["eos_id"])
    bos = token_meta.get("bos_id")
    greedy = continue_prompts(model, tokenizer, eos, prompts, n, bos_id=bos)
    sampled = continue_prompts(model, tokenizer, eos, prompts, n, **SAMPLING, bos_id=bos)
    rows = [
        {"prompt": p, "greedy": g, "sampled": s} for p, g, s in zip(prompts, greedy, sampled, strict=True)
    ]
    return write_json(path, {"max_new_tokens": n, "sampling": SAMPLING, "samples": rows})


def _check_config(cfg: ZayaConfig, max_seq_len: int) -> int:
    ecfg = cfg.eval
    if ecfg.batch_size < 1:
        raise ConfigError(f"eval.batch_size must be >= 1, got {ecfg.batch_size}")
    if ecfg.max_batches < 0:
        raise ConfigError(f"eval.max_batches must be >= 0 (0 = all), got {ecfg.max_batches}")
    if ecfg.task_limit < 0 or ecfg.task_limit == 1:
        raise ConfigError(
            f"eval.task_limit must be 0 (all) or >= 2 (a standard error needs two documents), "
            f"got {ecfg.task_limit}"
        )
    if ecfg.seq_len < 0:
        raise ConfigError(f"eval.seq_len must be >= 0 (0 = train.seq_len), got {ecfg.seq_len}")
    seq_len = ecfg.seq_len or cfg.train.seq_len
    if not 1 <= seq_len <= max_seq_len:
        key = "eval.seq_len" if ecfg.seq_len else "train.seq_len"
        raise ConfigError(f"{key}={seq_len} must be in [1, {max_seq_len}] (the model's max_seq_len)")
    return seq_len


def metrics_dict(result: EvalResult, seq_len: int, token_meta: dict) -> dict:
    return {
        "val_loss": round(result.loss, 6),
        "perplexity": round(result.perplexity, 4),
        "bits_per_byte": round(result.bits_per_byte, 6),
        "tokens": result.tokens,
        "bytes": result.bytes,
        "windows": result.windows,
        "seq_len": seq_len,
        "unigram_val_nats_per_token": token_meta.get("unigram_val_nats_per_token"),
        "unigram_val_bits_per_byte": token_meta.get("unigram_val_bits_per_byte"),
    }


def log_eval_metrics(client, run_info: dict, metrics: dict) -> None:
    """The numeric metrics, prefixed ``eval/``, on the training run (one batch call)."""
    from mlflow.entities import Metric
    from mlflow.exceptions import MlflowException

    now = int(time.time() * 1000)
    flat = dict(metrics)
    for task, values in flat.pop("tasks", {}).items():
        flat.update({f"tasks/{task}/{k}": v for k, v in values.items()})
    batch = [Metric(f"eval/{k}", float(v), now, 0) for k, v in flat.items() if isinstance(v, int | float)]
    try:
        client.log_batch(run_info["run_id"], metrics=batch)
    except MlflowException as exc:
        raise TrackingError(
            f"cannot log to run {run_info['run_id']} in {run_info['tracking_uri']}: {exc}"
        ) from None


def score_tasks(cfg: ZayaConfig, model, tokenizer, token_meta: dict, device: str) -> dict:
    """Zero-shot accuracy of ``model`` on every task of ``cfg.eval.tasks`` (files of the eval-data stage)."""
    from zaya_pipeline.eval.tasks import load_task, score_choices, task_metrics

    task_dir = Path(cfg.paths.eval_tasks)
    out = {}
    for i, task in enumerate(cfg.eval.tasks, 1):
        path = task_dir / f"{task}.jsonl.gz"
        if not path.is_file():
            raise DataError(f"{path} is missing: run the eval-data stage (zaya eval-data) for eval.tasks")
        start = time.perf_counter()
        items = load_task(path, cfg.eval.task_limit)
        eos, desc = int(token_meta["eos_id"]), f"task {i}/{len(cfg.eval.tasks)} {task}"
        bos = token_meta.get("bos_id")
        logliks = score_choices(
            model, tokenizer, items, eos, cfg.eval.batch_size, device, desc=desc, bos_id=bos
        )
        out[task] = {
            k: round(v, 6) if isinstance(v, float) else v for k, v in task_metrics(items, logliks).items()
        }
        m = out[task]
        log.info(
            "%s: acc %.3f ± %.3f, acc_norm %.3f (chance %.3f, %d documents, %.1f s)",
            *(
                task,
                m["acc"],
                m["acc_stderr"],
                m["acc_norm"],
                m["chance"],
                m["n"],
                time.perf_counter() - start,
            ),
        )
    return out


def evaluate(cfg: ZayaConfig) -> dict:
    from tokenizers import Tokenizer

    from zaya_pipeline.data.loader import PackedDataset, load_split, read_token_meta
    from zaya_pipeline.eval.plots import write_task_plots
    from zaya_pipeline.model.saved_model import load_model

    out = Path(cfg.paths.reports) / METRICS_FILE
    train_dir, tokens_dir = Path(cfg.paths.train), Path(cfg.paths.tokens)
    run_info = read_run_info(train_dir)
    # Open the run first: an unreachable store should fail before minutes of scoring, not after.
    client, _ = get_run(run_info["tracking_uri"], run_info["run_id"])

    device = "cuda" if torch.cuda.is_available() else "cpu"
    weights_sha256 = file_sha256(train_dir / "model.pt") if (train_dir / "model.pt").is_file() else None
    model, model_cfg = load_model(train_dir / "model.pt", map_location=device)
    seq_len = _check_config(cfg, model_cfg.max_seq_len)
    token_meta = read_token_meta(tokens_dir)
    val = load_split(tokens_dir, "val")
    top = int(val.max())
    if top >= model_cfg.vocab_size:
        raise DataError(
            f"{tokens_dir}/val holds token id {top} but the model in {train_dir}/model.pt has vocab_size "
            f"{model_cfg.vocab_size}: the tokens and the model come from different tokenizers"
        )
    byte_lengths = load_byte_lengths(Path(cfg.paths.tokenizer) / "tokenizer.json", model_cfg.vocab_size)
    dataset = PackedDataset(val, seq_len, seed=None)
    log.info(
        "scoring %d windows of %d tokens (batch %d, max_batches %d) on %s",
        len(dataset),
        seq_len,
        cfg.eval.batch_size,
        cfg.eval.max_batches,
        device,
    )
    start = time.perf_counter()
    result = evaluate_lm(
        model, dataset, byte_lengths, cfg.eval.batch_size, cfg.eval.max_batches, device=device
    )
    seconds = round(time.perf_counter() - start, 2)
    if not result.bytes:
        raise DataError(
            f"the scored tokens of {tokens_dir}/val stand for no text bytes (only special tokens?)"
        )
    if not math.isfinite(result.loss):
        raise DataError(f"the held-out loss of {train_dir}/model.pt is {result.loss}: nothing written")
    metrics = metrics_dict(result, seq_len, token_meta) | {"model_sha256": weights_sha256}
    tokenizer = Tokenizer.from_file(str(Path(cfg.paths.tokenizer) / "tokenizer.json"))  # tasks and samples
    if cfg.eval.tasks:
        tasks = score_tasks(cfg, model, tokenizer, token_meta, device)
        metrics["tasks"] = tasks
        metrics["tasks_above_chance"] = sum(m["acc"] - m["chance"] > m["acc_stderr"] for m in tasks.values())
    log_eval_metrics(client, run_info, metrics)
    reports = Path(cfg.paths.reports)
    with staged_files(reports, last=(METRICS_FILE,)) as stage:  # all new reports, or all the old ones
        extras = [write_samples(cfg, model, tokenizer, token_meta, stage / SAMPLES_FILE)]
        extras += write_task_plots(metrics.get("tasks", {}), stage / "plots")
        write_json(stage / METRICS_FILE, metrics)
        extras = [reports / p.relative_to(stage) for p in extras]
    for path in extras:
        client.log_artifact(run_info["run_id"], str(path), artifact_path="eval")
    log.info("wrote %s in %.1fs; logged to run %s", out, seconds, run_info["run_id"])
    return {
        "val_loss": metrics["val_loss"],
        "perplexity": metrics["perplexity"],
        "bits_per_byte": metrics["bits_per_byte"],
        "tokens": result.tokens,
        "tasks_above_chance": metrics.get("tasks_above_chance", 0),
        "seconds": seconds,
    }

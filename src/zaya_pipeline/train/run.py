"""The train stage: fit ZayaLM on the token shards with Lightning, log to MLflow, write model.pt and reports.

Outputs:
    <paths.train>/model.pt                 ``save_model`` format (model config + state dict)
    <paths.train>/run.json                 {run_id, experiment_id, tracking_uri}: evaluate/register log there
    <paths.reports>/train.json             DVC metrics (final losses, unigram baseline, throughput, sizes)
    <paths.reports>/plots/train.csv        step, loss, lr, tokens_per_s
    <paths.reports>/plots/val.csv          step, val_loss
    <paths.reports>/plots/expert_load.csv  step, layer, expert, fraction
    <paths.reports>/plots/schedule.csv     step, lr_multiplier, tokens_per_step (the planned schedule)
    <paths.reports>/plots/router_bias.csv  step, layer, expert, bias (ZAYA1 router; only a header otherwise)
    <paths.reports>/plots/*.png            loss, lr, throughput, expert_load, router_bias (train/plots.py);
                                           with <paths.train>/schedule.png logged to the run under plots/
    <paths.checkpoints>/step<N>/           every train.checkpoint_every steps and on SIGTERM (distributed/
                                           checkpoint.py); resume with train.resume=auto
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import tempfile
import time
import warnings
from pathlib import Path

import torch

from zaya_pipeline.config import ModelConfig, TrainConfig, ZayaConfig, as_dict
from zaya_pipeline.data.loader import read_token_meta
from zaya_pipeline.distributed.checkpoint import (
    TRAINER_FILE,
    is_complete,
    latest_checkpoint,
    list_checkpoints,
)
from zaya_pipeline.errors import ConfigError, DataError, Preempted
from zaya_pipeline.model.saved_model import save_model
from zaya_pipeline.model.sizing import forward_flops_per_token, num_active_params, num_params
from zaya_pipeline.train.optim import check_batch, check_schedule, planned_schedule
from zaya_pipeline.utils import (
    atomic_dir,
    get_logger,
    keep_freed_memory,
    remove_outputs,
    set_project_env,
    write_json,
)

log = get_logger("train")


def resolve_model_config(model: ModelConfig, meta: dict) -> ModelConfig:
    """``model.vocab_size`` 0 takes the tokenizer's (padded) vocabulary; any other value must equal it."""
    vocab = int(meta["vocab_size"])
    if model.vocab_size == 0:
        return dataclasses.replace(model, vocab_size=vocab)
    if model.vocab_size != vocab:
        raise ConfigError(
            f"model.vocab_size={model.vocab_size} does not match the tokenizer's vocab_size={vocab} "
            f"(token meta.json); set model.vocab_size=0 to take it from the tokenizer"
        )
    return model


def check_train_config(train: TrainConfig, model: ModelConfig, world_size: int = 1) -> None:
    for key in ("max_steps", "micro_batch", "seq_len", "val_every", "val_batches", "log_every"):
        if getattr(train, key) < 1:
            raise ConfigError(f"train.{key} must be >= 1, got {getattr(train, key)}")
    if train.seq_len > model.max_seq_len:
        raise ConfigError(f"train.seq_len={train.seq_len} exceeds model.max_seq_len={model.max_seq_len}")
    if train.checkpoint_every < 0:
        raise ConfigError(f"train.checkpoint_every must be >= 0, got {train.checkpoint_every}")
    check_batch(train, world_size)
    check_schedule(train.schedule, train.max_steps)


def resolve_resume(resume: str, checkpoints: Path) -> Path | None:
    """``train.resume``: "" = start fresh, "auto" = the latest complete checkpoint in ``checkpoints`` (fresh
    when there is none), else a checkpoint directory that must be complete."""
    if not resume:
        return None
    if resume == "auto":
        return latest_checkpoint(checkpoints)
    path = Path(resume)
    if not path.exists():
        raise ConfigError(f"train.resume: checkpoint {path} does not exist")
    if not is_complete(path):
        raise ConfigError(
            f"train.resume: {path} is not a complete checkpoint directory (.metadata and {TRAINER_FILE})"
        )
    return path


def world_size(parallel) -> int:
    """Training processes: ``parallel.devices`` per node × ``parallel.num_nodes``."""
    if parallel.devices < 1 or parallel.num_nodes < 1:
        raise ConfigError(
            "parallel.devices and parallel.num_nodes must be >= 1, "
            f"got {parallel.devices} and {parallel.num_nodes}"
        )
    return parallel.devices * parallel.num_nodes


def launch_rank(parallel) -> int:
    """This process's global rank as its launcher set it, before any process group exists: torchrun
    (RANK), srun (SLURM_PROCID), or Lightning's relaunch of this command (NODE_RANK, LOCAL_RANK); 0 for the
    process a person started. Only rank 0 touches MLflow and the stage's output folders."""
    env = os.environ
    if "RANK" in env:
        return int(env["RANK"])
    if int(env.get("SLURM_STEP_NUM_TASKS", "1")) > 1 and "SLURM_PROCID" in env:
        return int(env["SLURM_PROCID"])
    return int(env.get("NODE_RANK", 0)) * parallel.devices + int(env.get("LOCAL_RANK", 0))


def check_launcher_world(parallel) -> None:
    """torchrun / srun start the processes themselves: their count must be the configured world size."""
    world, env = world_size(parallel), os.environ
    for launcher, key in (("torchrun", "TORCHELASTIC_RUN_ID"), ("srun", "SLURM_STEP_NUM_TASKS")):
        count_key = "WORLD_SIZE" if launcher == "torchrun" else "SLURM_STEP_NUM_TASKS"
        if key in env and count_key in env and int(env[count_key]) > 1 and int(env[count_key]) != world:
            raise ConfigError(
                f"{launcher} started {env[count_key]} processes ({count_key}), but parallel.devices × "
                f"parallel.num_nodes = {parallel.devices} × {parallel.num_nodes} = {world}: set them to the "
                "processes per node and the number of nodes"
            )


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def write_csv(path: Path, header: tuple[str, ...], rows: list[tuple]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    os.replace(tmp, path)


def param_counts(cfg: ModelConfig) -> dict:
    return {
        "params_total": num_params(cfg),
        "params_active": num_active_params(cfg),
        "params_total_non_embedding": num_params(cfg, include_embedding=False),
        "params_active_non_embedding": num_active_params(cfg, include_embedding=False),
    }


def group_params(module) -> dict:
    """The parameter-group assignment as MLflow params: optimizer, weight decay and size of each group."""
    from zaya_pipeline.train.optim import assign_param_groups

    out = {}
    for g in assign_param_groups(module.model, module.train_cfg.optim):
        n = sum(p.numel() for p in g.params)
        out[f"optim.groups.{g.name}"] = f"{g.optimizer} wd={g.weight_decay} lr_scale={g.lr_scale} params={n}"
    return out


def _trainer(cfg: ZayaConfig, logger, callbacks: list, root: Path):
    import lightning as L

    t = cfg.train
    return L.Trainer(
        accelerator=cfg.parallel.accelerator,
        devices=cfg.parallel.devices,
        num_nodes=cfg.parallel.num_nodes,
        strategy=_strategy(cfg),
        precision=t.precision,
        max_steps=t.max_steps,
        deterministic=t.deterministic,
        val_check_interval=t.val_every,  # batches (= steps unless updates are skipped)
        check_val_every_n_epoch=None,  # the training stream is endless: no epochs
        limit_val_batches=t.val_batches,
        num_sanity_val_steps=0,
        log_every_n_steps=t.log_every,
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=False,  # train/checkpointing.py saves; model.pt is written by save_model
        enable_progress_bar=False,  # TrainTelemetry prints plain lines instead (CI logs)
        enable_model_summary=False,
        default_root_dir=str(root),
    )


OUR_STRATEGIES = ("auto", "single_device", "fsdp2")  # the ones that checkpoint (distributed/strategy.py)


def _strategy(cfg: ZayaConfig):
    """Ours for ``parallel.strategy=fsdp2`` (FSDP2 x EP on our mesh) and for one process; any other Lightning
    strategy name is passed through (without checkpoints)."""
    from zaya_pipeline.distributed.strategy import (
        ZayaParallelStrategy,
        ZayaSingleDeviceStrategy,
        single_device,
    )

    p = cfg.parallel
    if p.strategy == "fsdp2":
        return ZayaParallelStrategy(p, cfg.model.moe.num_experts)
    if p.strategy in OUR_STRATEGIES and world_size(p) == 1:
        return ZayaSingleDeviceStrategy(device=single_device(p.accelerator))
    return p.strategy


def train(cfg: ZayaConfig) -> dict:
    """Train the model described by ``cfg.model`` with ``cfg.train``; returns a short summary."""
    set_project_env()
    keep_freed_memory()
    import lightning as L
    from lightning.pytorch.loggers import MLFlowLogger

    from zaya_pipeline.tracking import default_run_name, run_tags, setup_mlflow, tracking_uri
    from zaya_pipeline.train.callbacks import TrainTelemetry
    from zaya_pipeline.train.checkpointing import Checkpointing
    from zaya_pipeline.train.data import TokenDataModule, source_dirs
    from zaya_pipeline.train.module import ZayaLitModule
    from zaya_pipeline.train.plots import TRAIN_PLOTS, save, schedule_figure, write_train_plots

    t_start = time.perf_counter()
    tcfg, paths = cfg.train, cfg.paths
    reports = Path(paths.reports)
    csvs = ("train", "val", "expert_load", "schedule", "router_bias")
    plots = {name: reports / "plots" / f"{name}.csv" for name in csvs}
    figures = [reports / "plots" / f"{name}.png" for name in TRAIN_PLOTS]
    lead = launch_rank(cfg.parallel) == 0
    check_launcher_world(cfg.parallel)
    if lead:
        remove_outputs(paths.train, reports / "train.json", *plots.values(), *figures)
    meta = read_token_meta(paths.tokens)
    if "unigram_val_nats_per_token" not in meta:
        raise DataError(
            f"{Path(paths.tokens) / 'meta.json'} lacks unigram_val_nats_per_token: run tokenize again"
        )
    model_cfg = resolve_model_config(cfg.model, meta)
    world = world_size(cfg.parallel)
    check_train_config(tcfg, model_cfg, world)
    ckpt_path = resolve_resume(tcfg.resume, Path(paths.checkpoints))
    checkpoints = tcfg.checkpoint_every > 0 or ckpt_path is not None
    if checkpoints and not (
        cfg.parallel.strategy == "fsdp2" or world == 1 and cfg.parallel.strategy in OUR_STRATEGIES
    ):
        raise ConfigError(
            f"train.checkpoint_every / train.resume need parallel.strategy=fsdp2 for {world} processes "
            f"(or one process), got parallel.strategy={cfg.parallel.strategy}"
        )
    if tcfg.checkpoint_every and ckpt_path is None and list_checkpoints(Path(paths.checkpoints)):
        raise ConfigError(
            f"{paths.checkpoints} holds checkpoints of an earlier run: continue it with train.resume=auto, "
            f"or move them away to start fresh"
        )
    if tcfg.num_threads > 0:
        torch.set_num_threads(tcfg.num_threads)

    L.seed_everything(tcfg.seed, workers=True, verbose=False)
    data = TokenDataModule(paths.tokens, tcfg, model_cfg.vocab_size, world)
    fsdp2 = cfg.parallel.strategy == "fsdp2"
    module = ZayaLitModule(model_cfg, tcfg, world, cfg.parallel if fsdp2 else None)
    sizes = param_counts(model_cfg)
    log.info(
        "model %s: %.2fM params (%.2fM active per token), vocab %d; %d steps of %d x %d tokens",
        *(model_cfg.name, sizes["params_total"] / 1e6, sizes["params_active"] / 1e6, model_cfg.vocab_size),
        *(tcfg.max_steps, tcfg.micro_batch, tcfg.seq_len),
    )

    uri = tracking_uri(cfg.registry)
    if lead:  # one writer: ranks opening a fresh SQLite store at once collide
        experiment_id = setup_mlflow(cfg.registry)
        logger = MLFlowLogger(
            experiment_name=cfg.registry.experiment_name,
            run_name=cfg.registry.run_name or default_run_name(model_cfg.name),
            tracking_uri=uri,
            log_model=False,
            tags=run_tags(uri, experiment_id),  # a sweep's child, a DVC experiment's name and group
        )
    else:
        from lightning.pytorch.loggers.logger import DummyLogger

        experiment_id, logger = "", DummyLogger()
    params = flatten(as_dict(cfg))
    params["model.vocab_size"] = model_cfg.vocab_size  # the resolved value, not the 0 placeholder
    logger.log_hyperparams({**params, **{f"model.{k}": v for k, v in sizes.items()}, **group_params(module)})
    schedule_rows = planned_schedule(tcfg, world)

    # Rank 0 builds paths.train; the other ranks write (nothing that survives) into a scratch folder.
    outputs = atomic_dir(paths.train) if lead else tempfile.TemporaryDirectory(prefix="zaya-train-rank")
    with outputs as out:
        out = Path(out)
        sources = tuple(source_dirs(tcfg, paths.tokens))
        telemetry = TrainTelemetry(
            *(tcfg.log_every, tcfg.max_steps, cfg.model.moe.skip_expert, sources),
            flops_per_token=3 * forward_flops_per_token(model_cfg, tcfg.seq_len),  # active params + attention
            precision=tcfg.precision,
            param_dtype=cfg.parallel.param_dtype if fsdp2 else "float32",
        )
        saver = Checkpointing(paths.checkpoints, tcfg.checkpoint_every, tcfg.checkpoint_keep)
        trainer = _trainer(cfg, logger, [telemetry, saver], out)
        if ckpt_path is not None:
            log.info("resuming from %s", ckpt_path)
        with warnings.catch_warnings():
            # On 2 CPU cores loader worker processes only steal time from the model.
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            # Lightning 2.6 calls a torch pytree API that torch 2.13 deprecates; nothing for us to change.
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
            trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
            if saver.preempted_at is not None:
                raise Preempted(
                    f"SIGTERM: stopped at step {saver.preempted_at} with a checkpoint in "
                    f"{paths.checkpoints}; run the same command with train.resume=auto to continue"
                )
            if telemetry.last_val_step != trainer.global_step:
                trainer.validate(module, datamodule=data, verbose=False)
        fit_s = time.perf_counter() - t_start
        full_state = module.full_state_dict()  # every rank takes part in the gathers
        if trainer.is_global_zero:
            save_model(out / "model.pt", module.model, model_cfg, full_state)
            run = {"run_id": logger.run_id, "experiment_id": experiment_id, "tracking_uri": uri}
            write_json(out / "run.json", run)
            save(schedule_figure(schedule_rows), out / "schedule.png")
            logger.experiment.log_artifact(logger.run_id, str(out / "schedule.png"), "plots")

    val_loss = telemetry.val_rows[-1][1]
    unigram = float(meta["unigram_val_nats_per_token"])
    steps = trainer.global_step
    metrics = {
        "val_loss": val_loss,
        "val_ppl": math.exp(val_loss),
        "train_loss": telemetry.last_train_loss,
        "unigram_val_nats_per_token": unigram,
        "val_over_unigram": val_loss / unigram,
        "steps": steps,
        "tokens_seen": telemetry.tokens_seen,
        "skipped_steps": telemetry.skipped_steps,
        "loss_spikes": telemetry.spikes,
        "tokens_per_s": telemetry.tokens_per_s_median,
        "train_s": telemetry.train_seconds,
        "wall_s": time.perf_counter() - t_start,
        **telemetry.throughput_summary(),  # mfu, tflops_per_device (medians), when the peak is known
        **sizes,
    }
    if trainer.is_global_zero:
        logger.log_metrics({f"final/{k}": float(v) for k, v in metrics.items()}, step=steps)
        write_csv(plots["train"], ("step", "loss", "lr", "tokens_per_s"), telemetry.train_rows)
        write_csv(plots["val"], ("step", "val_loss"), telemetry.val_rows)
        write_csv(plots["expert_load"], ("step", "layer", "expert", "fraction"), telemetry.load_rows)
        write_csv(plots["schedule"], ("step", "lr_multiplier", "tokens_per_step"), schedule_rows)
        write_csv(plots["router_bias"], ("step", "layer", "expert", "bias"), telemetry.bias_rows)
        pngs = write_train_plots(
            reports / "plots",
            train_rows=telemetry.train_rows,
            val_rows=telemetry.val_rows,
            load_rows=telemetry.load_rows,
            bias_rows=telemetry.bias_rows,
            mfu_rows=telemetry.mfu_rows,
            skip_expert=cfg.model.moe.skip_expert,
            unigram_nats=unigram,
        )
        for png in pngs:
            logger.experiment.log_artifact(logger.run_id, str(png), "plots")
        write_json(reports / "train.json", metrics)
    log.info("train: %d steps in %.1f s (until saved: %.1f s)", steps, metrics["wall_s"], fit_s)
    return {
        "val_loss": round(val_loss, 4),
        "unigram_val_nats_per_token": round(unigram, 4),
        "val_over_unigram": round(val_loss / unigram, 4),
        "tokens_per_s": round(metrics["tokens_per_s"]),
        "wall_s": round(metrics["wall_s"], 1),
        "model": str(Path(paths.train) / "model.pt"),
        "run_id": logger.run_id if lead else "",
    }

"""The train stage: fit ZayaLM on the token shards with Lightning, log to MLflow, write model.pt and reports.

    plan      check the config against the token meta, the checkpoints folder and the launcher, and decide
              the run (TrainPlan); ConfigError / DataError here, before anything on disk is touched
    build     the stage's old outputs are removed only then; data, LightningModule, MLflow logger, callbacks
              and Trainer
    fit       train (resumed from a checkpoint if planned), validate the last step
    write     model.pt and run.json (rank 0, into paths.train as a whole); then every telemetry callback
              writes its plots files and figures (train/callbacks/), and train.json

Outputs:
    <paths.train>/model.pt                 ``save_model`` format (model config + state dict)
    <paths.train>/run.json                 {run_id, experiment_id, tracking_uri}: evaluate/register log there
                                           (the default store as sqlite:///mlflow.db: relative to the repo)
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

import dataclasses
import math
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from zaya_pipeline.config import ModelConfig, OptimConfig, TrainConfig, ZayaConfig, as_dict
from zaya_pipeline.data.loader import check_boundary_mode, read_token_meta
from zaya_pipeline.distributed.checkpoint import (
    check_loadable,
    checkpoint_step,
    latest_checkpoint,
    legacy_checkpoints,
    list_checkpoints,
)
from zaya_pipeline.distributed.mesh import mesh_sizes
from zaya_pipeline.errors import ConfigError, DataError, Preempted, TrainingError
from zaya_pipeline.model.pretrained import check_init, init_state
from zaya_pipeline.model.saved_model import non_finite, save_model
from zaya_pipeline.model.sizing import forward_flops_per_token, num_active_params, num_params
from zaya_pipeline.model.transformer import ZayaLM
from zaya_pipeline.tracking import check_server
from zaya_pipeline.train.optim import (
    assign_param_groups,
    check_batch,
    check_optim,
    check_schedule,
    planned_schedule,
)
from zaya_pipeline.train.precision import lightning_precision, with_resolved_precision
from zaya_pipeline.train.stability import SpikeGuard
from zaya_pipeline.utils import (
    atomic_dir,
    get_logger,
    keep_freed_memory,
    remove_outputs,
    set_project_env,
    write_json,
)

if TYPE_CHECKING:
    import lightning as L

    from zaya_pipeline.train.callbacks import CheckpointSaver, Telemetry
    from zaya_pipeline.train.data import TokenDataModule
    from zaya_pipeline.train.module import ZayaLitModule

log = get_logger("train")

OUR_STRATEGIES = ("auto", "single_device", "fsdp2")  # the ones that checkpoint (distributed/strategy.py)
SCHEDULE_CSV = "schedule.csv"  # under <paths.reports>/plots, with the planned schedule's rows
SCHEDULE_HEADER = ("step", "lr_multiplier", "tokens_per_step")


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """What the train stage decided from the config and its inputs, before touching anything."""

    cfg: ZayaConfig
    model: ModelConfig  # cfg.model with the tokenizer's vocab_size
    world: int  # training processes: parallel.devices x parallel.num_nodes
    lead: bool  # global rank 0: the one process that touches MLflow and the output folders
    resume: Path | None  # the checkpoint to continue from
    init_from: Path | None  # weights to start from (train.init_from; None when resuming or not set)
    unigram_nats: float  # the unigram baseline of the validation split, nats/token (token meta.json)
    sizes: dict[str, int]  # parameter counts (param_counts)
    group_params: dict[str, str]  # the optimizer's parameter groups as MLflow params
    schedule_rows: list[tuple]  # the planned (step, lr_multiplier, tokens_per_step)

    @property
    def reports(self) -> Path:
        return Path(self.cfg.paths.reports)

    @property
    def fsdp2(self) -> bool:
        return self.cfg.parallel.strategy == "fsdp2"


@dataclasses.dataclass(frozen=True)
class TrainRun:
    """The built run: what fit trains and what the outputs are written from."""

    data: TokenDataModule
    module: ZayaLitModule
    logger: Any  # MLFlowLogger on rank 0, a DummyLogger elsewhere
    experiment_id: str  # "" off rank 0
    tracking_uri: str
    telemetry: Telemetry
    saver: CheckpointSaver
    trainer: L.Trainer


# --- plan ---------------------------------------------------------------------------------------------------


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


def token_meta(tokens: str | Path) -> dict:
    """The tokenize stage's meta.json, which must carry the unigram baseline."""
    meta = read_token_meta(tokens)
    if "unigram_val_nats_per_token" not in meta:
        raise DataError(f"{Path(tokens) / 'meta.json'} lacks unigram_val_nats_per_token: run tokenize again")
    return meta


def resolve_resume(resume: str, checkpoints: Path) -> Path | None:
    """``train.resume``: "" = start fresh, "auto" = the latest complete checkpoint in ``checkpoints`` (fresh
    when there is none), else a checkpoint directory that must be complete."""
    if not resume:
        return None
    if resume == "auto":
        latest, legacy = latest_checkpoint(checkpoints), legacy_checkpoints(checkpoints)
        if legacy and (latest is None or checkpoint_step(legacy[-1]) > checkpoint_step(latest)):
            check_loadable(legacy[-1])  # the newest one cannot be loaded: say so rather than start over
        return latest
    path = Path(resume)
    if not path.exists():
        raise ConfigError(f"train.resume: checkpoint {path} does not exist")
    check_loadable(path)
    return path


def check_checkpoints(cfg: ZayaConfig, world: int, resume: Path | None) -> None:
    """Only our strategies checkpoint; a fresh run that saves checkpoints needs an empty folder for them."""
    t, strategy = cfg.train, cfg.parallel.strategy
    if (t.checkpoint_every > 0 or resume is not None) and not (
        strategy == "fsdp2" or world == 1 and strategy in OUR_STRATEGIES
    ):
        raise ConfigError(
            f"train.checkpoint_every / train.resume need parallel.strategy=fsdp2 for {world} processes "
            f"(or one process), got parallel.strategy={strategy}"
        )
    folder = Path(cfg.paths.checkpoints)
    if t.checkpoint_every and resume is None and (list_checkpoints(folder) or legacy_checkpoints(folder)):
        raise ConfigError(
            f"{cfg.paths.checkpoints} holds checkpoints of an earlier run: continue it with "
            "train.resume=auto, or move them away to start fresh"
        )


def check_build(model: ModelConfig, cfg: ZayaConfig, world: int) -> dict[str, str]:
    """What building and fitting would refuse later: the model (built on the meta device: every model.*
    check, no memory), the spike guard, the optimizer and its parameter groups, the document boundaries
    and the FSDP2 mesh. Returns the parameter groups as MLflow params."""
    with torch.device("meta"):
        shapes_only = ZayaLM(model)
    SpikeGuard(cfg.train.stability)
    check_optim(cfg.train.optim)
    check_boundary_mode(cfg.train.data.doc_boundaries)
    if cfg.parallel.strategy == "fsdp2":
        mesh_sizes(cfg.parallel, world, model.moe.num_experts)
        if cfg.train.precision == "bf16-master":
            raise ConfigError(
                "train.precision=bf16-master is for one process; with parallel.strategy=fsdp2 set "
                "parallel.param_dtype=bfloat16 (FSDP2 keeps the fp32 masters) and train.precision=32-true"
            )
    return group_params(shapes_only, cfg.train.optim)


def plan(cfg: ZayaConfig) -> TrainPlan:
    """Check ``cfg`` against the inputs and decide the run. Raises ConfigError / DataError; reads the token
    meta and the checkpoints folder, writes nothing."""
    check_launcher_world(cfg.parallel)
    cfg = with_resolved_precision(cfg)  # train.precision=auto: what it means on this accelerator
    meta = token_meta(cfg.paths.tokens)
    model = resolve_model_config(cfg.model, meta)
    world = world_size(cfg.parallel)
    check_train_config(cfg.train, model, world)
    resume = resolve_resume(cfg.train.resume, Path(cfg.paths.checkpoints))
    check_checkpoints(cfg, world, resume)
    init_from = Path(cfg.train.init_from) if cfg.train.init_from and resume is None else None
    if init_from is not None:
        check_init(init_from, model)
    groups = check_build(model, cfg, world)
    # An unreachable tracking server: one line now, not minutes of MLflow's retries (the default store is a
    # local file, and resolving it may adopt a copied store: that is left to the run).
    check_server(cfg.registry.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", ""))
    return TrainPlan(
        cfg=cfg,
        model=model,
        world=world,
        lead=launch_rank(cfg.parallel) == 0,
        resume=resume,
        init_from=init_from,
        unigram_nats=float(meta["unigram_val_nats_per_token"]),
        sizes=param_counts(model),
        group_params=groups,
        schedule_rows=planned_schedule(cfg.train, world),
    )


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


def param_counts(cfg: ModelConfig) -> dict:
    return {
        "params_total": num_params(cfg),
        "params_active": num_active_params(cfg),
        "params_total_non_embedding": num_params(cfg, include_embedding=False),
        "params_active_non_embedding": num_active_params(cfg, include_embedding=False),
    }


def group_params(model: torch.nn.Module, optim: OptimConfig) -> dict:
    """The parameter-group assignment as MLflow params: optimizer, weight decay and size of each group."""
    out = {}
    for g in assign_param_groups(model, optim):
        n = sum(p.numel() for p in g.params)
        out[f"optim.groups.{g.name}"] = f"{g.optimizer} wd={g.weight_decay} lr_scale={g.lr_scale} params={n}"
    return out


def stage_outputs(plan: TrainPlan, telemetry: Telemetry) -> list[Path]:
    """Every output of the stage (checkpoints are not: they outlive runs)."""
    plots = plan.reports / "plots"
    names = [SCHEDULE_CSV, *telemetry.outputs]
    return [Path(plan.cfg.paths.train), plan.reports / "train.json", *(plots / name for name in names)]


# --- build --------------------------------------------------------------------------------------------------


def build_telemetry(plan: TrainPlan) -> Telemetry:
    """The telemetry callbacks (objects only: nothing runs or is written yet)."""
    from zaya_pipeline.train.callbacks import Telemetry
    from zaya_pipeline.train.data import source_dirs

    t = plan.cfg.train
    return Telemetry.create(
        t.log_every,
        t.max_steps,
        skip_expert=plan.model.moe.skip_expert,
        source_names=tuple(source_dirs(t, plan.cfg.paths.tokens)),
        flops_per_token=3 * forward_flops_per_token(plan.model, t.seq_len),  # active params + attention
        precision=t.precision,
        param_dtype=plan.cfg.parallel.param_dtype if plan.fsdp2 else "float32",
        unigram_nats=plan.unigram_nats,
    )


def build_logger(plan: TrainPlan) -> tuple[Any, str, str]:
    """(logger, experiment id, tracking URI): MLflow on rank 0, a no-op logger on the other ranks."""
    from zaya_pipeline.tracking import default_run_name, process_tags, run_tags, setup_mlflow, tracking_uri

    registry = plan.cfg.registry
    uri = tracking_uri(registry)
    if not plan.lead:
        from lightning.pytorch.loggers.logger import DummyLogger

        return DummyLogger(), "", uri
    from lightning.pytorch.loggers import MLFlowLogger

    experiment_id = setup_mlflow(registry)  # one writer: ranks opening a fresh SQLite store at once collide
    logger = MLFlowLogger(
        experiment_name=registry.experiment_name,
        run_name=registry.run_name or default_run_name(plan.model.name),
        tracking_uri=uri,
        log_model=False,
        # a sweep's child, a DVC experiment's name and group; this host and pid (tracking.end_dead_runs)
        tags={**run_tags(uri, experiment_id), **process_tags()},
    )
    return logger, experiment_id, uri


def hyperparams(plan: TrainPlan) -> dict:
    """The MLflow params of the run: the whole config flattened, the sizes and the parameter groups."""
    params = flatten(as_dict(plan.cfg))
    params["model.vocab_size"] = plan.model.vocab_size  # the resolved value, not the 0 placeholder
    return {**params, **{f"model.{k}": v for k, v in plan.sizes.items()}, **plan.group_params}


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def build(plan: TrainPlan, telemetry: Telemetry, root: Path, tracker: tuple[Any, str, str]) -> TrainRun:
    """Seed, then the data module, the LightningModule and the Trainer (rooted at ``root``), logging to
    ``tracker`` (build_logger)."""
    import lightning as L

    from zaya_pipeline.train.callbacks import CheckpointSaver
    from zaya_pipeline.train.data import TokenDataModule
    from zaya_pipeline.train.module import ZayaLitModule

    cfg, t, model = plan.cfg, plan.cfg.train, plan.model
    if t.num_threads > 0:
        torch.set_num_threads(t.num_threads)
    L.seed_everything(t.seed, workers=True, verbose=False)
    data = TokenDataModule(cfg.paths.tokens, t, model.vocab_size, plan.world)
    weights = None
    if plan.init_from is not None:
        weights = init_state(plan.init_from)
        log.info("starting from the weights of %s (train.init_from)", plan.init_from)
    parallel = cfg.parallel if plan.fsdp2 else None
    module = ZayaLitModule(model, t, plan.world, parallel, cfg.parallel.compile, init_state=weights)
    log.info(
        "model %s: %.2fM params (%.2fM active per token), vocab %d; %d steps of %d x %d tokens",
        *(model.name, plan.sizes["params_total"] / 1e6, plan.sizes["params_active"] / 1e6, model.vocab_size),
        *(t.max_steps, t.micro_batch, t.seq_len),
    )
    logger, experiment_id, uri = tracker
    logger.log_hyperparams(hyperparams(plan))
    saver = CheckpointSaver(cfg.paths.checkpoints, t.checkpoint_every, t.checkpoint_keep)
    trainer = _trainer(cfg, logger, [*telemetry, saver], root)
    return TrainRun(data, module, logger, experiment_id, uri, telemetry, saver, trainer)


def _trainer(cfg: ZayaConfig, logger, callbacks: list, root: Path):
    import lightning as L

    t = cfg.train
    return L.Trainer(
        accelerator=cfg.parallel.accelerator,
        devices=cfg.parallel.devices,
        num_nodes=cfg.parallel.num_nodes,
        strategy=_strategy(cfg),
        precision=lightning_precision(t.precision),
        max_steps=t.max_steps,
        deterministic=t.deterministic,
        val_check_interval=t.val_every,  # batches = steps (a skipped update is a step too)
        check_val_every_n_epoch=None,  # the training stream is endless: no epochs
        limit_val_batches=t.val_batches,
        num_sanity_val_steps=0,
        log_every_n_steps=t.log_every,
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=False,  # CheckpointSaver saves; model.pt is written by save_model
        enable_progress_bar=False,  # ProgressReport prints plain lines instead (CI logs)
        enable_model_summary=False,
        default_root_dir=str(root),
    )


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


# --- fit ----------------------------------------------------------------------------------------------------


def fit(plan: TrainPlan, run: TrainRun) -> None:
    """Train to ``train.max_steps`` (from ``plan.resume`` if set), then validate the last step if the last
    validation pass was earlier. Raises Preempted when SIGTERM stopped the run at a checkpoint."""
    if plan.resume is not None:
        log.info("resuming from %s", plan.resume)
    with warnings.catch_warnings():
        # On 2 CPU cores loader worker processes only steal time from the model.
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        # Lightning 2.6 calls a torch pytree API that torch 2.13 deprecates; nothing for us to change.
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
        run.trainer.fit(run.module, datamodule=run.data, ckpt_path=plan.resume)
        if run.saver.preempted_at is not None:
            raise Preempted(
                f"SIGTERM: stopped at step {run.saver.preempted_at} with a checkpoint in "
                f"{plan.cfg.paths.checkpoints}; run the same command with train.resume=auto to continue"
            )
        if run.telemetry.loss.last_val_step != run.trainer.global_step:
            run.trainer.validate(run.module, datamodule=run.data, verbose=False)


# --- write outputs ------------------------------------------------------------------------------------------


def check_diverged(plan: TrainPlan, run: TrainRun, state: dict) -> None:
    """Never a model.pt that cannot generate: weights holding NaN/Inf, or a last validation loss that is not
    finite, end the run with one line and keep the previous outputs (the loss guard acts on a streak of
    logged steps; a short or wild run can end diverged between two)."""
    bad = non_finite(state)
    val = run.telemetry.loss.val_rows[-1][1] if run.telemetry.loss.val_rows else float("nan")
    if bad or not math.isfinite(val):
        what = f"NaN or Inf weights ({len(bad)} tensors, e.g. {bad[0]})" if bad else f"validation loss {val}"
        raise TrainingError(
            f"training diverged: {what} at step {run.trainer.global_step}; model.pt not written, the "
            f"previous outputs are kept. Lower train.optim.lr (now {plan.cfg.train.optim.lr:g}) or raise "
            "train.schedule.warmup_steps"
        )


def write_model(plan: TrainPlan, run: TrainRun, out: Path) -> None:
    """model.pt, run.json and schedule.png into ``out`` (rank 0); every rank takes part in the gathers."""
    from zaya_pipeline.train.plots import save, schedule_figure

    full_state = run.module.full_state_dict()
    if not run.trainer.is_global_zero:
        return
    state = full_state if full_state is not None else run.module.model.state_dict()
    check_diverged(plan, run, state)
    save_model(out / "model.pt", run.module.model, plan.model, full_state)
    from zaya_pipeline.tracking import run_reference

    store = run_reference(run.tracking_uri)  # the default store relative to the repo: copies use their own
    ids = {"run_id": run.logger.run_id, "experiment_id": run.experiment_id, "tracking_uri": store}
    write_json(out / "run.json", ids)
    save(schedule_figure(plan.schedule_rows), out / "schedule.png")
    run.logger.experiment.log_artifact(run.logger.run_id, str(out / "schedule.png"), "plots")


def train_metrics(plan: TrainPlan, run: TrainRun, t_start: float) -> dict:
    """reports/train.json: final losses against the unigram baseline, steps, tokens, throughput, sizes."""
    meter, loss = run.telemetry.meter, run.telemetry.loss
    val_loss = loss.val_rows[-1][1]
    return {
        "val_loss": val_loss,
        "val_ppl": math.exp(val_loss),
        "train_loss": loss.last_train_loss,
        "unigram_val_nats_per_token": plan.unigram_nats,
        "val_over_unigram": val_loss / plan.unigram_nats,
        "steps": run.trainer.global_step,
        "tokens_seen": meter.tokens_seen,
        "skipped_steps": loss.skipped_steps,
        "loss_spikes": loss.spikes,
        "tokens_per_s": meter.tokens_per_s_median,
        "train_s": meter.train_seconds,
        "wall_s": time.perf_counter() - t_start,
        **meter.throughput_summary(),  # mfu, tflops_per_device (medians), when the peak is known
        **plan.sizes,
    }


def write_reports(plan: TrainPlan, run: TrainRun, metrics: dict) -> None:
    """Rank 0: the final metrics to the run, each telemetry callback's files, schedule.csv, train.json."""
    from zaya_pipeline.train.callbacks import write_csv

    run.logger.log_metrics({f"final/{k}": float(v) for k, v in metrics.items()}, step=metrics["steps"])
    for callback in run.telemetry:
        callback.write_outputs(plan.reports, run.logger)
    write_csv(plan.reports / "plots" / SCHEDULE_CSV, SCHEDULE_HEADER, plan.schedule_rows)
    write_json(plan.reports / "train.json", metrics)


def summary(plan: TrainPlan, run: TrainRun, metrics: dict) -> dict:
    unigram = plan.unigram_nats
    return {
        "val_loss": round(metrics["val_loss"], 4),
        "unigram_val_nats_per_token": round(unigram, 4),
        "val_over_unigram": round(metrics["val_loss"] / unigram, 4),
        "tokens_per_s": round(metrics["tokens_per_s"]),
        "wall_s": round(metrics["wall_s"], 1),
        "model": str(Path(plan.cfg.paths.train) / "model.pt"),
        "run_id": run.logger.run_id if plan.lead else "",
    }


def _load_libraries() -> None:
    """Lightning, MLflow and matplotlib load before the stage's clock starts (wall_s is the stage's work)."""
    import lightning  # noqa: F401
    import lightning.pytorch.loggers  # noqa: F401

    import zaya_pipeline.tracking  # noqa: F401
    import zaya_pipeline.train.callbacks  # noqa: F401
    import zaya_pipeline.train.data  # noqa: F401
    import zaya_pipeline.train.module  # noqa: F401


def train(cfg: ZayaConfig) -> dict:
    """Train the model described by ``cfg.model`` with ``cfg.train``; returns a short summary."""
    from zaya_pipeline.tracking import ending_run

    set_project_env()  # before MLflow is imported
    keep_freed_memory()
    _load_libraries()
    t_start = time.perf_counter()
    p = plan(cfg)
    telemetry = build_telemetry(p)
    # Rank 0 builds paths.train; the other ranks write (nothing that survives) into a scratch folder.
    outputs = atomic_dir(cfg.paths.train) if p.lead else tempfile.TemporaryDirectory(prefix="zaya-train-rank")
    logger, experiment_id, uri = build_logger(p)  # rank 0: the MLflow run starts here ...
    with ending_run(uri, logger.run_id if p.lead else ""):  # ... and ends FAILED / KILLED on every way out
        with outputs as out:
            run = build(p, telemetry, Path(out), (logger, experiment_id, uri))
            fit(p, run)
            fit_s = time.perf_counter() - t_start
            write_model(p, run, Path(out))
        metrics = train_metrics(p, run, t_start)
        if run.trainer.is_global_zero:
            # Only now, with the new model in place: a run that failed (a bad value the plan refused, a
            # crash, a diverged loss) left the previous model and reports as they were. paths.train was
            # swapped whole.
            remove_outputs(*stage_outputs(p, telemetry)[1:])
            write_reports(p, run, metrics)
    log.info("train: %d steps in %.1f s (until saved: %.1f s)", metrics["steps"], metrics["wall_s"], fit_s)
    return summary(p, run, metrics)

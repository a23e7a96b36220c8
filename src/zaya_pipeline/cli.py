"""``zaya <stage>``: thin entry points. Each composes the config and calls one library function.

Two ways to get a config:

* ``zaya train model.moe.num_experts=8`` composes ``conf/`` with Hydra overrides (``-m`` runs a sweep);
* ``zaya train --params params.yaml`` reads an already composed file, as the DVC stages do, so that
  ``dvc repro`` and ``dvc exp run -S ...`` run exactly what ``params.yaml`` says.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zaya_pipeline.errors import ConfigError, Terminated, ZayaError, environment_error
from zaya_pipeline.utils import get_logger, set_project_env, setup_logging


@dataclass(frozen=True)
class Stage:
    target: str  # "module:function", called with a ZayaConfig, returns a summary dict
    help: str


STAGES: dict[str, Stage] = {
    "prepare": Stage("zaya_pipeline.data.prepare:prepare", "fetch the raw corpus and write it as JSONL"),
    "curate": Stage("zaya_pipeline.data.curate:curate", "datatrove curation: filters, dedup, drop report"),
    "tokenizer": Stage("zaya_pipeline.data.tokenizer:train_tokenizer", "train (or copy) the BPE tokenizer"),
    "tokenize": Stage("zaya_pipeline.data.tokenize:tokenize", "tokenize into train/val token shards"),
    "train": Stage("zaya_pipeline.train.run:train", "train the MoE language model with Lightning"),
    "eval-data": Stage("zaya_pipeline.eval.task_data:eval_data", "extract the pinned multiple-choice tasks"),
    "evaluate": Stage(
        "zaya_pipeline.eval.evaluate:evaluate", "held-out loss, perplexity, bits-per-byte, zero-shot tasks"
    ),
    "register": Stage("zaya_pipeline.registry.register:register", "log and register the model in MLflow"),
    "summary": Stage("zaya_pipeline.summary:summary", "print where the metrics, plots and model are"),
    "model-info": Stage("zaya_pipeline.model.sizing:model_info", "parameter counts and FLOPs/token as JSON"),
    "plan": Stage(
        "zaya_pipeline.train.memory_plan:plan",
        "per-device memory and communication plan for a model x parallel layout",
    ),
}
PARAMS_HELP = "compose conf/ (+ overrides) into params.yaml, as `dvc exp run` does"

log = get_logger("cli")


def _call(stage: str, cfg: Any) -> dict:
    from zaya_pipeline.config_reads import reads_to_env_folder

    module, func = STAGES[stage].target.split(":")
    with reads_to_env_folder(stage, cfg):  # $ZAYA_CONFIG_READS: which keys the stage read (dvc.yaml params)
        result = getattr(importlib.import_module(module), func)(cfg)
    for key, value in (result or {}).items():
        log.info("%s: %s = %s", stage, key, value)
    return result or {}


def _usage() -> str:
    lines = ["usage: zaya <stage> [--params FILE] [-m] [key=value ...]", "", "stages:"]
    lines += [f"  {name:<10} {stage.help}" for name, stage in STAGES.items()]
    lines += [f"  {'params':<10} {PARAMS_HELP} (--out FILE, default params.yaml)"]
    lines += [f"  {'generate':<10} generate with a registered model: --model models:/<name>@champion PROMPT"]
    lines += [f"  {'export':<10} a Hugging Face model folder: --model models:/<name>@champion --out DIR"]
    lines += [f"  {'import':<10} a transformers `zaya` folder (ZAYA1) to model.pt: --from DIR --out FILE.pt"]
    lines += [
        f"  {'kernels':<10} static report: every expert kernel x config compiled for MI300X..A100 (--help)"
    ]
    lines += [
        "",
        "Without --params the config is composed from conf/ (Hydra): pick group members with group=member",
        "(e.g. model=debug, experiment=debug) and set values with key=value; -m sweeps comma lists.",
        "With --params FILE (as in dvc.yaml) FILE is the composed config and key=value overrides it.",
        "`zaya <stage> --help` shows the stage's config groups; `zaya <stage> --cfg job` prints the config.",
    ]
    return "\n".join(lines)


def _stage_help(stage: str) -> str:
    from zaya_pipeline.config import GROUPS, config_dir
    from zaya_pipeline.config_keys import group_members

    conf = config_dir()
    lines = [
        f"usage: zaya {stage} [--params FILE] [-m] [group=member ...] [key=value ...]",
        "",
        STAGES[stage].help,
    ]
    lines += ["", f"config groups (from {conf}):"]
    for group in GROUPS:
        lines.append(f"  {group:<14} {', '.join(group_members(group, conf))}")
        for sub in sorted(p for p in (conf / group).glob("*/") if p.is_dir()):
            name = f"{group}/{sub.name}"
            lines.append(f"  {name:<14} {', '.join(group_members(name, conf))}")
    lines += [
        "",
        "options:",
        "  --params FILE   read the composed config from FILE (e.g. params.yaml) instead of conf/",
        "  -m, --multirun  run a Hydra sweep over comma-separated values (e.g. train.optim.lr=1e-3,3e-3)",
        "  --cfg job       print the composed config and exit (Hydra)",
        "  -h, --help      show this help",
    ]
    return "\n".join(lines)


def _run_params_file(stage: str, params: str, overrides: list[str]) -> None:
    from zaya_pipeline.config import load_params

    _call(stage, load_params(params, overrides))


def _run_hydra(stage: str, argv: list[str]) -> None:
    import hydra
    from hydra._internal.utils import get_args_parser  # the parser hydra.main reads sys.argv with
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from zaya_pipeline.config import ZayaConfig, config_dir, to_schema
    from zaya_pipeline.config_keys import check_overrides
    from zaya_pipeline.sweep import OBJECTIVE, finish_active, job_paths, job_run_name

    conf = config_dir()
    # One line for a mistyped key or group member, before Hydra's many lines
    args, rest = get_args_parser().parse_known_args(argv)
    check_overrides([*args.overrides, *(a for a in rest if not a.startswith("-"))], conf, ZayaConfig)

    command_line = list(sys.argv)

    @hydra.main(config_path=str(conf), config_name="config", version_base="1.3")
    def app(raw: Any) -> float | None:
        # Hydra has parsed its argv: restore the real command line, which Lightning re-runs to launch the
        # other processes of a multi-process run (parallel.devices > 1).
        sys.argv = command_line
        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            with one_line_errors():  # inside: Hydra would print its own traceback for what escapes
                _call(stage, to_schema(raw, origin=f"{conf}/config.yaml"))
            return None
        # A sweep job (sweep.py): its own train outputs and reports under its folder, an MLflow run named
        # after its overrides. Errors are raised, not exited on: Hydra marks the job failed and runs the next.
        cfg = to_schema(raw, origin=f"{conf}/config.yaml")
        train_dir, reports = job_paths(Path(hc.runtime.output_dir))
        cfg.paths.train, cfg.paths.reports = str(train_dir), str(reports)
        cfg.registry.run_name = cfg.registry.run_name or job_run_name(list(hc.overrides.task), hc.job.num)
        try:
            result = _call(stage, cfg)
        except ZayaError as exc:
            log.error("sweep job #%s failed: %s", hc.job.num, exc)
            raise
        return result.get(OBJECTIVE)  # what Optuna minimises (the basic sweeper ignores it)

    sys.argv = [f"zaya {stage}", *argv]
    try:
        app()
    finally:
        finish_active()  # a sweep whose job failed still gets its summary and a closed parent run


def _params_command(argv: list[str]) -> None:
    from zaya_pipeline.params_file import write_params

    parser = argparse.ArgumentParser(prog="zaya params", description=PARAMS_HELP)
    parser.add_argument("--out", default="params.yaml", help="file to write (default: params.yaml)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=debug")
    args = parser.parse_args(argv)
    log.info("wrote %s", write_params(args.out, args.overrides))


def _generate_command(argv: list[str]) -> None:
    from zaya_pipeline.registry.generate_cli import generate

    for text in generate(argv):
        print(text)


def _export_command(argv: list[str]) -> None:
    from zaya_pipeline.registry.hf_export import export

    print(export(argv))


def _import_command(argv: list[str]) -> None:
    from zaya_pipeline.registry.hf_import import import_command

    result = import_command(argv)
    print(result["model"])
    if result["tokenizer"]:
        print(result["tokenizer"])


def _kernels_command(argv: list[str]) -> None:
    import os

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise ConfigError("zaya kernels compiles for GPU targets; unset TRITON_INTERPRET")
    from zaya_pipeline.kernel_report import main as report

    sys.exit(report(argv))


def _stage_command(stage: str, rest: list[str]) -> None:
    if any(a in ("-h", "--help") for a in rest):
        print(_stage_help(stage))
        sys.exit(0)
    parser = argparse.ArgumentParser(prog=f"zaya {stage}", add_help=False)
    parser.add_argument("--params")
    known, overrides = parser.parse_known_args(rest)
    if known.params:
        _run_params_file(stage, known.params, overrides)
    else:
        _run_hydra(stage, overrides)


# The commands that are not pipeline stages (those are STAGES): name -> function of the command's argv.
COMMANDS: dict[str, Callable[[list[str]], None]] = {
    "params": _params_command,
    "generate": _generate_command,
    "export": _export_command,
    "import": _import_command,
    "kernels": _kernels_command,
}


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """The one error path of every command: a user mistake (``ZayaError``), SIGTERM (``Terminated``) or a
    machine that refuses (a full disk, a read-only or corrupt store: ``errors.environment_error``) prints one
    ``error: ...`` line and exits with the error's code; anything else is a bug and keeps its traceback."""
    try:
        yield
    except (ZayaError, Terminated) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except Exception as exc:
        if (known := environment_error(exc)) is None:
            raise
        print(f"error: {known}", file=sys.stderr)
        sys.exit(known.exit_code)


def main(argv: list[str] | None = None) -> None:
    """``zaya <command>``. Ctrl-C exits with status 130 (128 + SIGINT) and one line: Python's own exit by
    SIGINT is lost once torch's dynamo has registered its exit handlers (the first custom-op call does)."""
    try:
        with one_line_errors():
            _main(argv)
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(130)


def _main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    set_project_env()
    setup_logging()
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        sys.exit(0 if argv else 2)
    name, rest = argv[0], argv[1:]
    if name in COMMANDS:
        COMMANDS[name](rest)
    elif name in STAGES:
        _stage_command(name, rest)
    else:
        print(f"error: unknown stage '{name}'\n\n{_usage()}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

"""What the multi-run training benchmarks (ablation.py, recipe.py, zaya1_default.py) share: the command
line ``--seeds/--train/--arms/--workdir/--set/--out``, arm validation, one real ``zaya train`` per arm and
seed, per-arm medians over seeds, and the JSON."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sweep_parser(doc: str, arms: list[str], workdir: str, out: Path) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--seeds", default="1234,1235", help="comma-separated training seeds (default: %(default)s)"
    )
    parser.add_argument("--train", default="default", help="train preset: equal tokens for every arm")
    parser.add_argument("--arms", default=",".join(arms), help="comma-separated arms (default: all)")
    parser.add_argument("--workdir", default=workdir, help="where each run writes")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every run, e.g. train.max_steps=1600 (repeatable)",
    )
    parser.add_argument("--out", default=str(out))
    parser.add_argument(
        "--add",
        action="store_true",
        help="keep the runs already in --out (same --train and --set) and add these, replacing any run of "
        "the same arm and seed",
    )
    return parser


def earlier_runs(args) -> tuple[list[dict], list[str]]:
    """With ``--add``: the runs and commands already in ``--out``; a file made with another train preset or
    other ``--set`` overrides is a usage error (its runs would not compare)."""
    if not args.add or not Path(args.out).is_file():
        return [], []
    old = json.loads(Path(args.out).read_text())
    if (old["train"], old["overrides"]) != (args.train, args.set):
        raise SystemExit(
            f"--add: {args.out} holds runs of --train {old['train']} --set {old['overrides']}, "
            f"not --train {args.train} --set {args.set}"
        )
    commands = old["command"] if isinstance(old["command"], list) else [old["command"]]
    return old["runs"], commands


def combined(earlier: list[dict], rows: list[dict], known_arms: list[str]) -> tuple[list[dict], list[str]]:
    """``earlier`` runs not redone in ``rows``, then ``rows``; the arms they cover in ``known_arms`` order."""
    redone = {(r["arm"], r["seed"]) for r in rows}
    runs = [r for r in earlier if (r["arm"], r["seed"]) not in redone] + rows
    return runs, [a for a in known_arms if any(r["arm"] == a for r in runs)]


def parse_sweep(parser: argparse.ArgumentParser, argv, known: list[str]):
    """(args, seeds, arms); an unknown arm is a usage error naming the known ones."""
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = [a.strip() for a in args.arms.split(",")]
    unknown = sorted(set(arms) - set(known))
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {known}")
    return args, seeds, arms


def run_slug(arm: str) -> str:
    """An arm's folder and MLflow run name: its name up to any " (" note, with every character but letters,
    digits, "+" and "." made "_" (a comma or space would split a Hydra override)."""
    return "".join(c if c.isalnum() or c in "+." else "_" for c in arm.split(" (")[0])


def train_run(slug: str, seed: int, overrides: list[str], args, experiment: str, model: str = "tiny") -> dict:
    """One ``zaya train model=<model> train=<args.train> <overrides> <args.set>`` with its own outputs under
    ``args.workdir/<slug>-s<seed>`` and MLflow run ``<slug>-s<seed>`` in ``experiment``; returns the run's
    train.json with ``out`` (its folder) and ``wall_s``."""
    out = Path(args.workdir) / f"{slug}-s{seed}"
    cmd = [
        str(Path(sys.executable).parent / "zaya"),
        "train",
        f"model={model}",
        f"train={args.train}",
        *overrides,
        *args.set,
        f"train.seed={seed}",
        f"paths.train={out}/train",
        f"paths.reports={out}/reports",
        f"registry.experiment_name={experiment}",
        f"registry.run_name={slug}-s{seed}",
    ]
    print(f"[{slug} seed {seed}] {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    metrics = json.loads((out / "reports" / "train.json").read_text())
    return {**metrics, "out": out, "wall_s": round(time.perf_counter() - t0, 1)}


def result_row(arm: str, seed: int, metrics: dict) -> dict:
    """The fields every benchmark row has, from ``train_run``'s result."""
    keys = ("val_loss", "val_over_unigram", "tokens_seen", "tokens_per_s", "wall_s")
    return {"arm": arm, "seed": seed, **{k: metrics[k] for k in keys}}


def medians(rows: list[dict], arms: list[str], median_keys: tuple, first_keys: tuple) -> dict:
    """Per arm: the median over its runs of ``median_keys``, and ``first_keys`` from its first run."""
    summary = {}
    for name in arms:
        mine = [r for r in rows if r["arm"] == name]
        summary[name] = {k: statistics.median(r[k] for r in mine) for k in median_keys}
        summary[name] |= {k: mine[0][k] for k in first_keys}
    return summary


def write_result(script: str, argv, args, summary: dict, rows: list[dict], earlier: list[str] = ()) -> None:
    """The JSON at ``--out`` (its seeds are the runs', in order of first appearance); ``earlier``: the
    commands of runs kept from it (``--add``)."""
    command = f"python benchmarks/{script} " + " ".join(argv if argv is not None else sys.argv[1:])
    result = {
        "command": [*earlier, command] if earlier else command,
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "seeds": list(dict.fromkeys(r["seed"] for r in rows)),
        "train": args.train,
        "overrides": args.set,
        "summary_median_over_seeds": summary,
        "runs": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))

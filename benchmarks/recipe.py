"""Training-recipe comparison on the embedded corpus: AdamW vs Muon+AdamW, cosine vs WSD, at equal tokens.

Every arm trains the ``tiny`` model with the ``train`` preset given (same steps, batch and tokens), and
differs only in ``train/optim`` and ``train/schedule``; validation runs every ``--val-every`` steps so the
curves can be drawn side by side. Each run is a real ``zaya train`` (MLflow experiment ``zaya_recipe``,
run name ``<arm>-s<seed>``); the tokens must exist (``dvc repro tokenize``). Writes a JSON file (one row
per run with its validation curve, and per-arm medians over seeds) and a PNG of the curves.

    python benchmarks/recipe.py --seeds 1234,1235 --out benchmarks/results/recipe.json \
        --plot docs/img/recipe_val_loss.png
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# arm name -> overrides
ARMS: dict[str, list[str]] = {
    "adamw+cosine": ["train/optim=adamw", "train/schedule=cosine"],
    "muon+cosine": ["train/optim=muon", "train/schedule=cosine"],
    "adamw+wsd": ["train/optim=adamw", "train/schedule=wsd"],
    "muon+wsd": ["train/optim=muon", "train/schedule=wsd"],
}


def run_arm(name: str, seed: int, args: argparse.Namespace) -> dict:
    from sweep_cli import result_row, train_run

    metrics = train_run(name, seed, [*ARMS[name], f"train.val_every={args.val_every}"], args, "zaya_recipe")
    with open(metrics["out"] / "reports" / "plots" / "val.csv") as f:
        curve = [(int(r["step"]), float(r["val_loss"])) for r in csv.DictReader(f)]
    row = {**result_row(name, seed, metrics), "val_curve": curve}
    print(f"[{name} seed {seed}] val_loss {row['val_loss']:.4f}  {row['wall_s']} s", flush=True)
    return row


def plot(rows: list[dict], arms: list[str], path: Path) -> None:
    """Median-over-seeds validation curves: optimizers compared on the left, schedules on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def median_curve(arm: str) -> tuple[list[int], list[float]]:
        curves = [r["val_curve"] for r in rows if r["arm"] == arm]
        steps = [s for s, _ in curves[0]]
        return steps, [statistics.median(c[i][1] for c in curves) for i in range(len(steps))]

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    panels = (("optimizer", ("cosine", "wsd")), ("schedule", ("adamw", "muon")))
    for ax, (title, groups) in zip(axes, panels, strict=True):
        for arm in arms:
            steps, losses = median_curve(arm)
            opt, sched = arm.split("+")
            group = sched if title == "optimizer" else opt
            style = "-" if (opt == "muon" if title == "optimizer" else sched == "wsd") else "--"
            color = {groups[0]: "tab:blue", groups[1]: "tab:orange"}[group]
            ax.plot(steps, losses, style, color=color, label=arm)
        ax.set(title=f"{title}s compared", xlabel="optimizer step")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("validation loss (nats/token)")
    lo = min(min(v for _, v in r["val_curve"]) for r in rows)
    axes[0].set_ylim(lo - 0.1, lo + 1.5)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from sweep_cli import combined, earlier_runs, medians, parse_sweep, sweep_parser, write_result

    parser = sweep_parser(__doc__, list(ARMS), "/tmp/zaya_recipe", ROOT / "benchmarks/results/recipe.json")
    parser.add_argument("--val-every", type=int, default=25, help="steps between validation passes")
    parser.add_argument("--plot", default=str(ROOT / "docs/img/recipe_val_loss.png"))
    args, seeds, arms = parse_sweep(parser, argv, list(ARMS))
    earlier, commands = earlier_runs(args)

    rows = [run_arm(name, seed, args) for seed in seeds for name in arms]
    rows, arms = combined(earlier, rows, list(ARMS))
    summary = medians(rows, arms, ("val_loss", "val_over_unigram", "tokens_per_s"), ("tokens_seen",))
    write_result("recipe.py", argv, args, summary, rows, commands)
    plot(rows, arms, Path(args.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

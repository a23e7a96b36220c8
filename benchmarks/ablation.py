"""Architecture ablation on the embedded corpus: CCA vs GQA attention and ZAYA1 vs linear router.

Every arm trains ``model=tiny_gqa`` (the embedded default before issue 35: a generic MoE) with top-1
routing over 8 experts for the same number of tokens (the ``train`` preset given), with the expert width of
each arm adjusted so that its ACTIVE parameter count matches the ZAYA1-style arm (CCA + ZAYA1 router) as
closely as an integer width allows. A reference arm (plain multi-head attention, linear router, unadjusted)
shows where ``tiny_gqa`` sits.

Each run is a real ``zaya train`` (logged to MLflow under the experiment ``zaya_ablation``, run name
``<arm>-s<seed>``); the tokens must exist (``dvc repro tokenize``). Results: a JSON file with one row per
run and the per-arm medians over seeds.

    python benchmarks/ablation.py --seeds 1234,1235 --out benchmarks/results/ablation.json
    python benchmarks/ablation.py --seeds 1234,1235,1236 --set train.max_steps=1600 \
        --out benchmarks/results/ablation_zaya_exact.json   # 4x the tokens (2026-12-07)
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP1 = ["model.moe.top_k=1", "model.moe.num_experts=8"]
COMPRESSED = ["model.attention.n_heads=4", "model.attention.n_kv_heads=2", "model.attention.head_dim=16"]
ZAYA1_ROUTER = [
    "model.moe.router.type=zaya1",
    "model.moe.router.dim=32",
    "model.moe.router.aux_loss_coef=0.0",
]
ROUTER_TUNED = ["model.moe.router.mlp_init_std=0.18", "model.moe.router.bias_p_gain=0.001"]
CCA = ["model.attention.type=cca", "model.attention.rope_fraction=0.5"]

# arm name -> (overrides, match the target's active parameters?)
ARMS: dict[str, tuple[list[str], bool]] = {
    "cca+zaya1": (TOP1 + COMPRESSED + CCA + ZAYA1_ROUTER, False),  # the target
    # the tiny default's router settings (issue 35): MLP init 1/sqrt(router width), balancing gain 0.001
    "cca+zaya1 tuned": (TOP1 + COMPRESSED + CCA + ZAYA1_ROUTER + ROUTER_TUNED, False),
    "gqa+zaya1": (TOP1 + COMPRESSED + ["model.attention.rope_fraction=0.5"] + ZAYA1_ROUTER, True),
    "cca+linear": (TOP1 + COMPRESSED + CCA, True),
    "gqa+linear": (TOP1 + COMPRESSED + ["model.attention.rope_fraction=0.5"], True),
    "mha+linear (reference)": (TOP1, False),
}
TARGET = "cca+zaya1"
BASE = "tiny_gqa"


def model_cfg(overrides: list[str]):
    from zaya_pipeline.config import load_config
    from zaya_pipeline.model.sizing import with_resolved_vocab

    return with_resolved_vocab(load_config([f"model={BASE}", *overrides]))


def matched_expert_hidden(overrides: list[str], target_active: int) -> int:
    """The expert width whose active non-embedding parameter count is closest to ``target_active``."""
    from zaya_pipeline.model.sizing import num_active_params

    base = model_cfg(overrides)

    def active(width: int) -> int:
        moe = dataclasses.replace(base.moe, expert_hidden=width)
        return num_active_params(dataclasses.replace(base, moe=moe), include_embedding=False)

    return min(range(1, 4 * base.moe.expert_hidden), key=lambda w: abs(active(w) - target_active))


def load_balance(plots: Path, num_experts: int) -> float:
    """Mean over layers of max/mean expert load in the last logged interval (skip expert excluded)."""
    rows = list(csv.DictReader((plots / "expert_load.csv").open()))
    last = max(int(r["step"]) for r in rows)
    per_layer: dict[int, list[float]] = {}
    for r in rows:
        if int(r["step"]) == last and int(r["expert"]) < num_experts:
            per_layer.setdefault(int(r["layer"]), []).append(float(r["fraction"]))
    ratios = [max(f) * len(f) / sum(f) for f in per_layer.values()]
    return sum(ratios) / len(ratios)


def arm_fields(overrides: list[str], plots: Path) -> dict:
    """Expert balance over the last logged interval and the sizes of the arm's model."""
    from zaya_pipeline.model.sizing import num_active_params, num_params

    cfg = model_cfg(overrides)
    return {
        "max_over_mean_load": load_balance(plots, cfg.moe.num_experts),
        "params_active_non_embedding": num_active_params(cfg, include_embedding=False),
        "params_total_non_embedding": num_params(cfg, include_embedding=False),
        "expert_hidden": cfg.moe.expert_hidden,
    }


def run_arm(name: str, overrides: list[str], seed: int, args) -> dict:
    from sweep_cli import result_row, run_slug, train_run

    metrics = train_run(run_slug(name), seed, overrides, args, "zaya_ablation", BASE)
    row = result_row(name, seed, metrics) | arm_fields(overrides, metrics["out"] / "reports" / "plots")
    print(f"[{name} seed {seed}] " + json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    from sweep_cli import combined, earlier_runs, medians, parse_sweep, sweep_parser, write_result

    out = ROOT / "benchmarks/results/ablation.json"
    parser = sweep_parser(__doc__, list(ARMS), "/tmp/zaya_ablation", out)
    args, seeds, arms = parse_sweep(parser, argv, list(ARMS))
    earlier, commands = earlier_runs(args)

    from zaya_pipeline.model.sizing import num_active_params

    target = num_active_params(model_cfg(ARMS[TARGET][0]), include_embedding=False)
    rows = []
    for name in arms:
        overrides, match = ARMS[name]
        if match:
            overrides = [*overrides, f"model.moe.expert_hidden={matched_expert_hidden(overrides, target)}"]
        for seed in seeds:
            rows.append(run_arm(name, overrides, seed, args))
    rows, arms = combined(earlier, rows, list(ARMS))
    summary = medians(
        rows,
        arms,
        ("val_loss", "val_over_unigram", "max_over_mean_load", "tokens_per_s"),
        ("params_active_non_embedding", "expert_hidden", "tokens_seen"),
    )
    write_result("ablation.py", argv, args, summary, rows, commands)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

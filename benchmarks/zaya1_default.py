"""Which tiny ZAYA1 should the embedded default train (issue 35)? The default before it (``tiny_gqa``) beside
ZAYA1 arms of the same active size, and the ZAYA1 router's knobs, on the same tokens.

Every arm trains ``model=tiny_gqa`` plus its overrides (so the arms do not move when conf/model/tiny.yaml
does) with the ``train`` preset given (default: the embedded default's 400 steps x 16 x 128 tokens), seeds in
``--seeds``. The ZAYA1 arms are transformers' ``zaya`` architecture: CCA with 4 query heads in 2 key/value
groups of width 32, the ZAYA1 router (width 32, EDA, no auxiliary loss) with the skip expert, top-1 over
experts of 512, residual scaling. Round 1 starts from transformers' init (8 experts, balancing gain 0.01)
and changes one knob per arm: the controller's gain, the router's learning rate (its parameter group's
``lr_scale``), the skip expert's initial bias, the EDA scales' init. Round 2 starts from what round 1 and
single-seed diagnostics pointed to (``CHOSEN``: 4 experts, the MoE output scale starting at 5, the router
MLP initialised at 1/sqrt(router width), gain 0.001 -- conf/model/tiny.yaml) and varies it again. Each run is
a real ``zaya train`` (MLflow experiment ``zaya_default``); the tokens must exist (``dvc repro tokenize``)::

    python benchmarks/zaya1_default.py --seeds 1234,1235,1236 \
        --arms "$(python benchmarks/zaya1_default.py --round 2)" --set train.num_threads=1 \
        --out benchmarks/results/zaya1_default.json
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ZAYA1_TINY = [
    "model.attention.type=cca",
    "model.attention.n_heads=4",
    "model.attention.n_kv_heads=2",
    "model.attention.head_dim=32",
    "model.attention.rope_fraction=0.5",
    "model.moe.top_k=1",
    "model.moe.expert_hidden=512",
    "model.moe.skip_expert=true",
    "model.moe.router.type=zaya1",
    "model.moe.router.dim=32",
    "model.moe.router.aux_loss_coef=0.0",
    "model.residual_scaling=true",
]


def router_lr_scale(scale: float) -> str:
    """The default parameter-group rules with the router group's ``lr_scale`` changed, as one override
    (Hydra cannot override one element of a list)."""
    from zaya_pipeline.config import as_dict, load_config

    groups = as_dict(load_config([f"model={BASE}"]))["train"]["optim"]["param_groups"]
    for g in groups:
        if g["name"] == "router":
            g["lr_scale"] = scale

    def render(v) -> str:
        if isinstance(v, dict):
            return "{" + ",".join(f"{k}:{render(x)}" for k, x in v.items()) + "}"
        if isinstance(v, list):
            return "[" + ",".join(render(x) for x in v) + "]"
        if isinstance(v, str):
            return f"'{v}'"
        return "null" if v is None else str(v)

    return "+train.optim.param_groups=" + render(groups)


CHOSEN = [
    *ZAYA1_TINY,
    "model.moe.num_experts=4",
    "model.moe_out_scale_init=5.0",
    "model.moe.router.mlp_init_std=0.18",
    "model.moe.router.bias_p_gain=0.001",
]

ROUND_2 = {
    "tiny_gqa (the default before)": [],
    "zaya1": ZAYA1_TINY,
    "chosen (conf/model/tiny.yaml)": CHOSEN,
    "chosen + 8 experts + out scale 9": [*CHOSEN, "model.moe.num_experts=8", "model.moe_out_scale_init=9.0"],
    "chosen + router lr x3": [*CHOSEN, "ROUTER_LR=3.0"],
    "chosen + eda init 1": [*CHOSEN, "model.moe.router.eda_init=1.0"],
}
ARMS: dict[str, list[str]] = {
    **ROUND_2,
    "zaya1 gain 0.001": [*ZAYA1_TINY, "model.moe.router.bias_p_gain=0.001"],
    "zaya1 gain 0.05": [*ZAYA1_TINY, "model.moe.router.bias_p_gain=0.05"],
    "zaya1 router lr x0.3": [*ZAYA1_TINY, "ROUTER_LR=0.3"],
    "zaya1 router lr x3": [*ZAYA1_TINY, "ROUTER_LR=3.0"],
    "zaya1 skip bias -3": [*ZAYA1_TINY, "model.moe.skip_bias_init=-3.0"],
    "zaya1 eda init 1": [*ZAYA1_TINY, "model.moe.router.eda_init=1.0"],
}
BASE = "tiny_gqa"


def expand(overrides: list[str]) -> list[str]:
    return [router_lr_scale(float(o.split("=")[1])) if o.startswith("ROUTER_LR=") else o for o in overrides]


def run_arm(name: str, overrides: list[str], seed: int, args) -> dict:
    from ablation import arm_fields
    from sweep_cli import result_row, run_slug, train_run

    metrics = train_run(run_slug(name), seed, expand(overrides), args, "zaya_default", BASE)
    model_overrides = [o for o in overrides if not o.startswith("ROUTER_LR=")]
    row = result_row(name, seed, metrics) | arm_fields(model_overrides, metrics["out"] / "reports" / "plots")
    print(f"[{name} seed {seed}] " + json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    from sweep_cli import combined, earlier_runs, medians, parse_sweep, sweep_parser, write_result

    out = ROOT / "benchmarks/results/zaya1_default.json"
    parser = sweep_parser(__doc__, list(ARMS), "/tmp/zaya_default", out)
    parser.add_argument("--round", type=int, choices=(2,), help="print round 2's arms (for --arms) and exit")
    args, seeds, arms = parse_sweep(parser, argv, list(ARMS))
    if args.round:
        print(",".join(ROUND_2))
        return 0
    earlier, commands = earlier_runs(args)
    rows = [run_arm(name, ARMS[name], seed, args) for seed in seeds for name in arms]
    rows, arms = combined(earlier, rows, list(ARMS))
    summary = medians(
        rows,
        arms,
        ("val_loss", "val_over_unigram", "max_over_mean_load", "tokens_per_s"),
        ("params_active_non_embedding", "params_total_non_embedding", "tokens_seen"),
    )
    write_result("zaya1_default.py", argv, args, summary, rows, commands)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

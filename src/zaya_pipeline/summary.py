"""``zaya summary``: where the pipeline's results are, with the headline figures."""

from __future__ import annotations

import json
from pathlib import Path

from zaya_pipeline.config import ZayaConfig
from zaya_pipeline.tracking import tracking_uri


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def summary(cfg: ZayaConfig) -> dict:
    reports = Path(cfg.paths.reports)
    metrics, train, registry = (_load(reports / n) for n in ("metrics.json", "train.json", "registry.json"))
    uri = registry.get("tracking_uri") or tracking_uri(cfg.registry)
    lines = ["", "zaya_pipeline results", "====================="]
    if metrics:
        nan = float("nan")
        loss, ppl = metrics.get("val_loss", nan), metrics.get("perplexity", nan)
        bpb, unigram = metrics.get("bits_per_byte", nan), metrics.get("unigram_val_nats_per_token", nan)
        lines.append(
            f"held-out: loss {loss:.4f} nats/token, perplexity {ppl:.2f}, {bpb:.4f} bits/byte "
            f"(unigram baseline {unigram:.4f} nats/token)"
        )
        for name, m in metrics.get("tasks", {}).items():
            lines.append(
                f"  {name:<14} acc {m['acc']:.3f} ± {m['acc_stderr']:.3f}  "
                f"(chance {m['chance']:.3f}, n {m['n']})"
            )
    if train:
        lines.append(
            f"training: {train.get('steps')} steps, {train.get('tokens_seen')} tokens, "
            f"{train.get('wall_s', 0):.0f} s"
        )
    lines += [
        f"metrics:  {reports}/metrics.json, stage reports in {reports}/*.json  (dvc metrics show)",
        f"plots:    {reports}/plots/*.csv     (dvc plots show → dvc_plots/index.html)",
        f"model:    {cfg.paths.train}/model.pt",
    ]
    if registry:
        lines.append(f"registry: {registry.get('model_uri')}  (run {registry.get('run_id')})")
    lines.append(f"mlflow:   {uri}            (make ui → http://127.0.0.1:5000)")
    print("\n".join(lines))
    return {}

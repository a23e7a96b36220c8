"""Training-data loader throughput against the tokens/s the debug training consumes, side by side.

Token shards in the tokenize stage's format (``--tokens DIR``, or synthetic ones: ``--shards`` files of
``--shard-tokens`` uint16 ids, documents of geometric length with mean ``--doc-len`` ending in EOS) are read
through the train stage's own data module (``TokenDataModule.stream``: memory-mapped shards, the mixture
stream, the ``train=debug`` batch of 16 x 64 tokens). Arms, alternated in every round after one warm-up:

* ``loader_<mode>``: ``--batches`` batches with ``train.data.doc_boundaries=<mode>`` (none,
  reset_positions, mask), one thread, as the train stage draws them (in its own process, between steps);
* ``train_<mode>``: ``--steps`` optimizer steps of ``model=debug`` (forward, loss + aux loss, backward,
  grad clipping, AdamW) on those batches, with torch's default threads; no Lightning, no logging, so
  an upper bound on what ``zaya train train=debug model=debug`` consumes.

Per arm the JSON holds the median tokens per wall second and per CPU second (``time.process_time``: other
load on the machine does not count), and the ratios loader / train (target: >= 100)::

    python benchmarks/loader_throughput.py --out benchmarks/results/loader_throughput.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench_env import header, version_of

MODES = ("none", "reset_positions", "mask")
VOCAB, EOS = 4096, 0


def write_shards(root: Path, shards: int, shard_tokens: int, doc_len: int) -> Path:
    """Synthetic train/val shards + meta.json, as the tokenize stage lays them out."""
    rng = np.random.default_rng(0)
    for split, n in (("train", shards), ("val", 1)):
        (root / split).mkdir(parents=True)
        for i in range(n):
            ids = rng.integers(1, VOCAB, size=shard_tokens, dtype=np.uint16)
            ids[rng.random(shard_tokens) < 1 / doc_len] = EOS
            ids.astype("<u2").tofile(root / split / f"{i:05d}.ds")
    meta = {"token_dtype": "uint16", "vocab_size": VOCAB, "eos_id": EOS, "bos_id": None}
    (root / "meta.json").write_text(json.dumps(meta))
    return root


def data_module(tokens: Path, mode: str):
    from zaya_pipeline.config import load_config
    from zaya_pipeline.data.loader import read_token_meta
    from zaya_pipeline.train.data import TokenDataModule

    cfg = load_config(["train=debug", "model=debug", f"train.data.doc_boundaries={mode}"])
    dm = TokenDataModule(tokens, cfg.train, vocab_size=read_token_meta(tokens)["vocab_size"])
    dm.setup("fit")
    return cfg, dm


def timed(fn) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


class Trainer:
    """The debug model's optimizer steps, as the training step does them (without Lightning)."""

    def __init__(self, cfg, vocab_size: int, batches: list[dict]):
        from zaya_pipeline.model.transformer import ZayaLM
        from zaya_pipeline.train.module import boundary_kwargs, lm_loss
        from zaya_pipeline.train.optim import build_optimizer

        torch.manual_seed(0)
        self.model = ZayaLM(dataclasses.replace(cfg.model, vocab_size=vocab_size))
        self.opt = build_optimizer(self.model, cfg.train.optim)
        self.batches, self.clip = batches, cfg.train.optim.grad_clip or float("inf")
        self._kwargs, self._loss = boundary_kwargs, lm_loss

    def steps(self, n: int) -> None:
        for i in range(n):
            batch = self.batches[i % len(self.batches)]
            out = self.model(batch["input_ids"], **self._kwargs(batch))
            (self._loss(out.logits, batch["labels"]) + out.aux_loss).backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=Path, help="a tokenize-stage output folder (default: synthetic shards)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-tokens", type=int, default=4_000_000)
    ap.add_argument("--doc-len", type=int, default=500, help="mean document length of synthetic shards")
    ap.add_argument("--batches", type=int, default=1000, help="loader batches per round and mode")
    ap.add_argument("--steps", type=int, default=20, help="training steps per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--train-modes", nargs="+", default=["none", "mask"], choices=MODES)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="loader_bench_") as tmp:
        tokens = args.tokens or write_shards(Path(tmp), args.shards, args.shard_tokens, args.doc_len)
        modules = {mode: data_module(tokens, mode) for mode in MODES}
        cfg = modules["none"][0]
        tokens_per_batch = cfg.train.micro_batch * cfg.train.seq_len

        def loader_arm(mode: str):
            stream = iter(modules[mode][1].stream(start_batch=0))
            return lambda: [next(stream) for _ in range(args.batches)]

        arms, work = {}, {}
        for mode in MODES:
            arms[f"loader_{mode}"], work[f"loader_{mode}"] = loader_arm(mode), args.batches * tokens_per_batch
        for mode in args.train_modes:
            batches = [modules[mode][1].stream().batch(b) for b in range(args.steps)]
            trainer = Trainer(modules[mode][0], modules[mode][1].vocab_size, batches)
            arms[f"train_{mode}"] = lambda t=trainer: t.steps(args.steps)
            work[f"train_{mode}"] = args.steps * tokens_per_batch
        for fn in arms.values():  # warm-up: first-call costs, allocator
            fn()
        rounds = []
        for r in range(args.rounds):
            row = {}
            for name, fn in arms.items():
                cpu, wall = timed(fn)
                row[name] = {"cpu_s": round(cpu, 4), "wall_s": round(wall, 4)}
            rounds.append(row)
            print(
                f"round {r}: " + ", ".join(f"{k} {work[k] / v['wall_s']:,.0f} tok/s" for k, v in row.items())
            )

    def med(name: str, key: str) -> float:
        return statistics.median(work[name] / row[name][key] for row in rounds)

    summary = {
        name: {
            "median_tokens_per_wall_s": round(med(name, "wall_s")),
            "median_tokens_per_cpu_s": round(med(name, "cpu_s")),
        }
        for name in arms
    }
    ratios = {
        f"loader_{m}_over_train_{t}_{unit}": round(
            statistics.median(
                (work[f"loader_{m}"] / row[f"loader_{m}"][key])
                / (work[f"train_{t}"] / row[f"train_{t}"][key])
                for row in rounds
            ),
            1,
        )
        for m in MODES
        for t in args.train_modes
        for unit, key in (("wall", "wall_s"), ("cpu", "cpu_s"))
    }
    result = {
        **header("loader_throughput"),
        "torch_threads": torch.get_num_threads(),
        "versions": {p: version_of(p) for p in ("torch", "numpy")},
        "tokens": str(args.tokens)
        if args.tokens
        else {
            "synthetic_shards": args.shards,
            "shard_tokens": args.shard_tokens,
            "mean_doc_len": args.doc_len,
        },
        "batch": {"sequences": cfg.train.micro_batch, "seq_len": cfg.train.seq_len},
        "summary": summary,
        "median_ratios": ratios,
        "target_ratio": 100,
        "rounds": rounds,
    }
    print(json.dumps({k: result[k] for k in ("summary", "median_ratios")}, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

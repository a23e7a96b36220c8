"""What the train stage of `make run` costs with the tiny ZAYA1 default against the default before it
(``tiny_gqa``): the real ``zaya train`` of each preset (``train=default``: 400 steps x 16 x 128 tokens, the
machine's threads), alternating, ``--rounds`` times; wall seconds and tokens/s per run, medians and the ratio.
The tokens must exist (``dvc repro tokenize``). Nothing else should run meanwhile::

    python benchmarks/default_train_time.py --rounds 2 --out benchmarks/results/default_train_time.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ("tiny_gqa", "tiny")


def main(argv: list[str] | None = None) -> int:
    from sweep_cli import train_run

    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--rounds", type=int, default=2, help="runs per preset, alternating")
    parser.add_argument("--workdir", default="/tmp/zaya_default_time", help="where each run writes")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/default_train_time.json"))
    args = parser.parse_args(argv)
    args.train, args.set = "default", []
    runs = []
    for i in range(args.rounds):
        for preset in PRESETS:
            m = train_run(f"{preset}-r{i}", 1234, [], args, "zaya_default_time", preset)
            keys = ("wall_s", "tokens_per_s", "val_loss")
            runs.append({"model": preset, "round": i, **{k: m[k] for k in keys}})
            print(json.dumps(runs[-1]), flush=True)
    med = {
        p: {k: statistics.median(r[k] for r in runs if r["model"] == p) for k in ("wall_s", "tokens_per_s")}
        for p in PRESETS
    }
    given = sys.argv[1:] if argv is None else argv
    result = {
        "command": "python benchmarks/default_train_time.py " + " ".join(given),
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "median": med,
        "wall_ratio_tiny_over_tiny_gqa": med["tiny"]["wall_s"] / med["tiny_gqa"]["wall_s"],
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median"], indent=2), result["wall_ratio_tiny_over_tiny_gqa"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

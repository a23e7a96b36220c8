"""``params.yaml``: the composed default config, written exactly as ``dvc exp run`` writes it.

DVC's Hydra composition dumps ``OmegaConf.to_yaml(compose(...))`` into params.yaml; we produce the same text,
so ``make params`` and ``dvc exp run`` never fight over formatting, and a test compares the checked-in file
with a fresh composition.
"""

from __future__ import annotations

from pathlib import Path

from zaya_pipeline.config import compose, to_schema


def compose_params_yaml(overrides: list[str] | tuple[str, ...] = (), conf_dir: Path | None = None) -> str:
    from omegaconf import OmegaConf

    cfg = compose(overrides, conf_dir)
    OmegaConf.resolve(cfg)
    to_schema(cfg, origin="conf/config.yaml")  # fail here, not in a stage, on a key the schema lacks
    return OmegaConf.to_yaml(cfg)


def write_params(path: str | Path = "params.yaml", overrides: list[str] | tuple[str, ...] = ()) -> Path:
    path = Path(path)
    path.write_text(compose_params_yaml(overrides), encoding="utf-8")
    return path

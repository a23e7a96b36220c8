"""A finished pipeline up to `register`, small and real: a trained BPE tokenizer, token shards, a saved
ZayaLM, a training run in a SQLite MLflow store (run.json) and the evaluate stage's metrics.json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow import MlflowClient

from zaya_pipeline.config import AttentionConfig, ModelConfig, MoEConfig, TokenizerConfig, ZayaConfig
from zaya_pipeline.data.tokenizer import pad_vocab, train_bpe
from zaya_pipeline.eval.evaluate import evaluate
from zaya_pipeline.model.saved_model import save_model
from zaya_pipeline.model.transformer import ZayaLM

DOCS = [f"document {i}: the café serves naïve tea at {i % 7} o'clock, said the dog." for i in range(60)]


def make_cfg(root: Path) -> ZayaConfig:
    cfg = ZayaConfig()
    cfg.paths.tokenizer, cfg.paths.tokens = str(root / "tokenizer"), str(root / "tokens")
    cfg.paths.train, cfg.paths.reports = str(root / "train"), str(root / "reports")
    cfg.train.seq_len, cfg.eval.max_batches = 16, 2
    cfg.eval.tasks = []  # multiple-choice tasks are tested in tests/eval
    cfg.registry.tracking_uri = f"sqlite:///{root}/mlflow.db"
    cfg.registry.model_name = "zaya-test"
    return cfg


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("registry")
    cfg = make_cfg(root)
    tok = train_bpe(DOCS, TokenizerConfig(vocab_size=300))
    pad_vocab(tok, 64)
    (root / "tokenizer").mkdir()
    tok.save(str(root / "tokenizer" / "tokenizer.json"))
    vocab, eos = tok.get_vocab_size(), tok.token_to_id("<|endoftext|>")
    tok_meta = {"vocab_size": vocab, "eos_id": eos, "eos_token": "<|endoftext|>"}
    (root / "tokenizer" / "meta.json").write_text(json.dumps(tok_meta))
    ids = [t for d in DOCS for t in [*tok.encode(d, add_special_tokens=False).ids, eos]]
    (root / "tokens" / "val").mkdir(parents=True)
    np.array(ids, dtype=np.uint16).tofile(root / "tokens" / "val" / "000_val.ds")
    (root / "tokens" / "meta.json").write_text(json.dumps({"token_dtype": "uint16", **tok_meta}))

    torch.manual_seed(0)
    mcfg = ModelConfig(
        vocab_size=vocab, d_model=32, n_layers=1, attention=AttentionConfig(n_heads=2), max_seq_len=32,
        moe=MoEConfig(num_experts=2, top_k=1, expert_hidden=32),
    )  # fmt: skip
    save_model(root / "train" / "model.pt", ZayaLM(mcfg), mcfg)

    uri = cfg.registry.tracking_uri
    client = MlflowClient(uri)
    exp = client.create_experiment("registry-test", artifact_location=(root / "mlartifacts").as_uri())
    run = client.create_run(exp)
    client.set_terminated(run.info.run_id)
    info = {"run_id": run.info.run_id, "experiment_id": exp, "tracking_uri": uri}
    (root / "train" / "run.json").write_text(json.dumps(info))
    evaluate(cfg)
    return {"root": root, "cfg": cfg, "uri": uri, "run_id": run.info.run_id, "eos": eos}


def workspace_generator(workspace: dict, model_config: dict | None = None):
    """``ZayaGenerator`` loaded in-process from the workspace's model and tokenizer files (``model_config``:
    what ``register`` records with a version, e.g. the serving caps)."""
    from types import SimpleNamespace

    from zaya_pipeline.registry.pyfunc import ZayaGenerator

    root = workspace["root"]
    artifacts = {
        "model": str(root / "train" / "model.pt"),
        "tokenizer": str(root / "tokenizer" / "tokenizer.json"),
        "tokenizer_meta": str(root / "tokenizer" / "meta.json"),
    }
    gen = ZayaGenerator()
    gen.load_context(SimpleNamespace(artifacts=artifacts, model_config=model_config))
    return gen

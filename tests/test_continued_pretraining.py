"""Continued pretraining from a transformers ``zaya`` folder, the whole route through ``dvc repro``
(``experiment=zaya1_continue``), on a tiny ZAYA folder that transformers itself writes (random weights with
``model=debug``'s architecture, and a small BPE tokenizer with its tokenizer_config.json):

    tokenizer (the folder's) -> tokenize -> train from the folder's weights (the loss falls) -> evaluate
    -> register -> zaya export (transformers' own format) -> stock transformers loads it, our logits

and ``zaya import`` of the same folder gives a model.pt with transformers' logits.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("transformers")

from support.project import BIN, copy_project, run  # noqa: E402
from support.transformers_side import load_with_transformers, zaya_generate  # noqa: E402
from zaya_pipeline.config import TokenizerConfig, load_config  # noqa: E402
from zaya_pipeline.data.tokenizer import train_bpe  # noqa: E402
from zaya_pipeline.model import hf_format  # noqa: E402
from zaya_pipeline.model.saved_model import load_model  # noqa: E402

pytestmark = pytest.mark.slow

VOCAB = 448  # the folder's model vocabulary: the tokenizer's 400 tokens are padded up to it
EOS, BOS = "<|endoftext|>", "<|bos|>"  # documents are BOS text EOS, as with ZAYA1's own tokenizer
DOCS = [
    f"Record {i}: the database keeps {i % 9} tables of orders, and the index on the customer column makes "
    f"every lookup by name fast. A transaction that fails leaves no trace of its {i % 5} writes."
    for i in range(200)
]
TRAIN = [
    "train.max_steps=40",
    "train.val_every=20",
    "train.log_every=5",
    "train.schedule.warmup_steps=5",
    "eval.tasks=[arc_easy]",
]


@pytest.fixture(scope="module")
def zaya_folder(tmp_path_factory) -> Path:
    """What transformers' ZayaForCausalLM.save_pretrained writes, plus a tokenizer a user would ship."""
    from transformers import ZayaConfig, ZayaForCausalLM

    root = tmp_path_factory.mktemp("zaya1-tiny")
    tok = train_bpe(DOCS, TokenizerConfig(vocab_size=400, bos_token=BOS))
    tok.save(str(root / "tokenizer.json"))
    special = {"eos_token": EOS, "pad_token": "<|pad|>", "bos_token": {"content": BOS, "special": True}}
    tokenizer_config = {**special, "tokenizer_class": "PreTrainedTokenizerFast"}
    (root / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    ids = {f"{k}_id": tok.token_to_id(v if isinstance(v, str) else v["content"]) for k, v in special.items()}
    cfg = dataclasses.replace(load_config(["model=debug"]).model, vocab_size=VOCAB)
    config = dict(hf_format.hf_config(cfg, ids))
    config.pop("model_type"), config.pop("architectures")
    torch.manual_seed(0)
    ZayaForCausalLM(ZayaConfig(**config)).save_pretrained(root)
    return root


def test_zaya_import_gives_a_model_pt_with_transformers_logits(zaya_folder, tmp_path):
    from transformers import ZayaForCausalLM

    out = run(
        [str(BIN / "zaya"), "import", "--from", str(zaya_folder), "--out", str(tmp_path / "model.pt")],
        tmp_path,
    )
    assert {str(tmp_path / "model.pt"), str(tmp_path / "tokenizer")} <= set(out.splitlines())
    ours, cfg = load_model(tmp_path / "model.pt")
    meta = json.loads((tmp_path / "tokenizer" / "meta.json").read_text())
    assert meta["vocab_size"] == cfg.vocab_size == VOCAB and meta["eos_token"] == "<|endoftext|>"
    theirs = ZayaForCausalLM.from_pretrained(zaya_folder).eval()
    x = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(x).logits, theirs(x, use_cache=False).logits, rtol=1e-5, atol=1e-5)
    # and `zaya export` gives the folder's weights back, tensor for tensor
    cmd = ["export", "--model", str(tmp_path / "model.pt"), "--tokenizer", str(tmp_path / "tokenizer")]
    run([str(BIN / "zaya"), *cmd, "--out", str(tmp_path / "hf")], tmp_path)
    original = load_file(str(zaya_folder / "model.safetensors"))
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(exported) == set(original)
    for key, tensor in original.items():
        assert torch.equal(exported[key], tensor), key


@pytest.fixture(scope="module")
def repo(zaya_folder, tmp_path_factory) -> Path:
    overrides = ["experiment=zaya1_continue", f"train.init_from={zaya_folder}", "model=debug"]
    overrides += ["data=debug", "train=debug", "eval=debug", "registry=debug", "parallel=debug", *TRAIN]
    repo = copy_project(tmp_path_factory.mktemp("continue") / "repo", *overrides)
    run([str(BIN / "dvc"), "repro"], repo, timeout=1800)
    return repo


def test_the_route_trains_from_the_folder_and_registers(repo, zaya_folder):
    tokenizer = json.loads((repo / "artifacts" / "tokenizer" / "meta.json").read_text())
    assert tokenizer["source"] == str(zaya_folder) and tokenizer["vocab_size"] == VOCAB
    assert (tokenizer["eos_token"], tokenizer["bos_token"]) == (EOS, BOS)
    tokens = json.loads((repo / "data" / "tokens" / "meta.json").read_text())
    assert (tokens["eos_id"], tokens["bos_id"]) == (tokenizer["eos_id"], tokenizer["bos_id"])
    run_params = json.loads((repo / "reports" / "train.json").read_text())
    assert run_params["params_total"] == hf_format_params(zaya_folder)
    rows = list(csv.DictReader((repo / "reports" / "plots" / "train.csv").open()))
    losses = [float(r["loss"]) for r in rows]
    assert losses[-1] < losses[0] - 0.5, f"the loss did not fall: {losses}"
    metrics = json.loads((repo / "reports" / "metrics.json").read_text())
    assert metrics["val_loss"] < min(losses[0], math.log(VOCAB) - 1)  # held out: well below where it began
    assert (repo / "reports" / "registry.json").is_file()


def hf_format_params(folder: Path) -> int:
    # the tied head is stored once: the folder's tensors are the model's parameters and balancing biases
    tensors = load_file(str(folder / "model.safetensors"))
    return sum(t.numel() for k, t in tensors.items() if not k.endswith("balancing_biases"))


def test_the_registered_champion_exports_to_stock_transformers(repo):
    """Transformers' own class, the document start (EOS, BOS) as in training, our logits, and the greedy
    text of `zaya generate`."""
    registry = json.loads((repo / "reports" / "registry.json").read_text())
    out = repo / "hf"
    run([str(BIN / "zaya"), "export", "--model", registry["model_uri"], "--out", str(out)], repo)
    assert json.loads((out / "config.json").read_text())["model_type"] == "zaya"
    prompt = "The database"
    theirs = load_with_transformers(out, prompt)
    assert theirs["class"] == "ZayaForCausalLM"
    meta = json.loads((repo / "artifacts" / "tokenizer" / "meta.json").read_text())
    assert theirs["ids"][:2] == [meta["eos_id"], meta["bos_id"]]
    ours, _ = load_model(repo / "artifacts" / "train" / "model.pt")
    with torch.no_grad():
        logits = ours(torch.tensor([theirs["ids"]])).logits[0]
    torch.testing.assert_close(torch.tensor(theirs["logits"]), logits, rtol=1e-5, atol=1e-5)
    assert zaya_generate(repo, registry["model_uri"], prompt) == theirs["text"]

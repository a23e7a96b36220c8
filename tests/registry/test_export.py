"""``zaya export``: transformers itself, in a fresh process, loads the Hugging Face folder of each model
variant. ZAYA1's architecture (CCA, the ZAYA1 router with its skip expert, top-1) is written in
transformers' own ``zaya`` format and loads as its ``ZayaForCausalLM`` without remote code; the ablation arms
(GQA attention, the linear router, no skip expert) fall back to remote code (``trust_remote_code=True``).
Either way its logits equal ours and its greedy ``generate`` (with a KV cache) gives our tokens. From a
registered version, it generates the text ``zaya generate`` does."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from conftest import DOCS  # noqa: E402
from zaya_pipeline.config import AttentionConfig, ModelConfig, MoEConfig, RouterConfig, TokenizerConfig  # noqa: E402
from zaya_pipeline.data.tokenizer import pad_vocab, train_bpe  # noqa: E402
from zaya_pipeline.errors import ConfigError, DataError  # noqa: E402
from zaya_pipeline.model.generate import generate  # noqa: E402
from zaya_pipeline.model.saved_model import load_model, save_model  # noqa: E402
from zaya_pipeline.model.transformer import ZayaLM  # noqa: E402
from zaya_pipeline.registry.hf_export import export  # noqa: E402

PROMPT = "document 3: the café"
NEW_TOKENS = 8

# What a fresh process does with an exported folder: transformers' Auto classes, nothing of ours imported
# by hand (the remote code of a fallback folder imports zaya_pipeline itself). Remote code is allowed only
# for a folder whose config.json says zaya_moe; everything transformers logs or warns is returned.
HF_SIDE = """
import io, json, logging, sys, warnings, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
logs = io.StringIO()
handler = logging.StreamHandler(logs)
logging.getLogger("transformers").addHandler(handler)
warnings.simplefilter("always")
out = {}
for folder in sys.argv[2:]:
    remote = json.load(open(folder + "/config.json"))["model_type"] == "zaya_moe"
    with warnings.catch_warnings(record=True) as caught:
        model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=remote)
        tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=remote)
    embed = model.get_input_embeddings()
    ids = tok(sys.argv[1], return_tensors="pt").input_ids
    steps = []
    hook = embed.register_forward_hook(lambda m, i, o: steps.append(i[0].shape[1]))
    with torch.no_grad():
        logits = model(ids).logits[0].tolist()
        steps.clear()
        gen = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()
    out[folder] = {
        "ids": ids[0].tolist(), "logits": logits, "generated": gen, "steps": steps,
        "text": tok.decode(gen[ids.shape[1]:], skip_special_tokens=True),
        "special": [tok.bos_token, tok.eos_token, tok.pad_token], "model_type": model.config.model_type,
        "class": f"{type(model).__module__}.{type(model).__name__}",
        "warnings": [str(w.message) for w in caught], "logs": logs.getvalue(),
    }
    logs.truncate(0)
print(json.dumps(out))
""".replace("NEW_TOKENS", str(NEW_TOKENS))


def hf_side(prompt: str, folders: list[Path]) -> dict:
    cmd = [sys.executable, "-c", HF_SIDE, prompt, *map(str, folders)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CCA = AttentionConfig("cca", n_heads=4, n_kv_heads=2, head_dim=8, rope_fraction=0.5)
# name -> (attention, router, skip expert, residual scaling); the first is transformers' own zaya format
VARIANTS = {
    "zaya": (CCA, RouterConfig(type="zaya1", dim=8), True, True),
    "gqa-linear": (AttentionConfig(n_heads=2), RouterConfig(), False, False),
    "gqa-zaya1-skip": (AttentionConfig(n_heads=2), RouterConfig(type="zaya1", dim=8), True, False),
    "cca-linear-skip": (CCA, RouterConfig(), True, False),
    "cca-zaya1": (CCA, RouterConfig(type="zaya1", dim=8), False, True),
}
ZAYA_FORMAT = {"zaya"}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export-tokenizer")
    tok = train_bpe(DOCS, TokenizerConfig(vocab_size=300))
    pad_vocab(tok, 64)
    tok.save(str(root / "tokenizer.json"))
    meta = {
        "vocab_size": tok.get_vocab_size(),
        "eos_id": tok.token_to_id("<|endoftext|>"),
        "eos_token": "<|endoftext|>",
        "pad_token": "<|pad|>",
    }
    (root / "meta.json").write_text(json.dumps(meta))
    return root


def variant_model(name: str, vocab: int, path: Path, max_seq_len: int = 48) -> Path:
    attention, router, skip, scaled = VARIANTS[name]
    torch.manual_seed(len(name))
    cfg = ModelConfig(
        vocab_size=vocab, d_model=32, n_layers=2, max_seq_len=max_seq_len, attention=attention,
        tie_embeddings=False, residual_scaling=scaled, moe_out_scale_init=1.0,
        moe=MoEConfig(num_experts=4, top_k=1, expert_hidden=16, skip_expert=skip, router=router),
    )  # fmt: skip
    model = ZayaLM(cfg)
    with torch.no_grad():  # a random model's logits are nearly flat: spread them so greedy picks vary
        model.lm_head.weight.mul_(50)
        for p in model.parameters():  # transformers' format: every bias, scale and temperature moved
            if p.ndim == 1 and name in ZAYA_FORMAT:  # away from its init, so that a wrong mapping shows
                p.add_(torch.randn_like(p) * 0.1)
    return save_model(path, model, cfg)


@pytest.mark.slow
def test_transformers_loads_every_variant_with_our_logits_and_greedy_tokens(tmp_path, tokenizer_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    vocab, eos = tok.get_vocab_size(), tok.token_to_id("<|endoftext|>")
    folders = {}
    for name in VARIANTS:
        model_pt = variant_model(name, vocab, tmp_path / name / "model.pt")
        folders[name] = export(
            [
                "--model",
                str(model_pt),
                "--tokenizer",
                str(tokenizer_dir),
                "--out",
                str(tmp_path / f"hf-{name}"),
            ]
        )
    theirs = hf_side(PROMPT, list(folders.values()))
    ids = [eos, *tok.encode(PROMPT, add_special_tokens=False).ids]  # what zaya generate feeds the model
    for name, folder in folders.items():
        hf = theirs[str(folder)]
        assert hf["ids"] == ids, name  # AutoTokenizer puts EOS first, as training did
        assert hf["special"] == ["<|endoftext|>", "<|endoftext|>", "<|pad|>"]
        if name in ZAYA_FORMAT:  # stock transformers' own class, no remote code, nothing to warn about
            assert hf["model_type"] == "zaya", name
            assert hf["class"] == "transformers.models.zaya.modeling_zaya.ZayaForCausalLM"
            assert not hf["warnings"] and not hf["logs"].strip(), (hf["warnings"], hf["logs"])
        else:
            assert hf["model_type"] == "zaya_moe", name
        ours, _ = load_model(tmp_path / name / "model.pt")
        with torch.no_grad():
            logits = ours(torch.tensor([ids])).logits[0]
            greedy = generate(ours, torch.tensor([ids]), NEW_TOKENS, eos_id=None)[0].tolist()
        torch.testing.assert_close(torch.tensor(hf["logits"]), logits, rtol=1e-5, atol=1e-5, msg=name)
        assert hf["generated"] == greedy, name
        assert len(set(greedy[len(ids) :])) > 1, f"{name}: a constant continuation would prove little"
        assert hf["steps"] == [len(ids)] + [1] * (NEW_TOKENS - 1), f"{name}: the KV cache was not used"


def test_a_registered_version_exports_and_generates_what_zaya_generate_does(tmp_path, workspace):
    from zaya_pipeline.registry.generate_cli import generate as zaya_generate
    from zaya_pipeline.registry.register import register

    result = register(workspace["cfg"])
    uri, model_uri = workspace["uri"], result["model_uri"]
    folder = export(["--model", model_uri, "--tracking-uri", uri, "--out", str(tmp_path / "hf")])
    assert (folder / "README.md").read_text().startswith("#")  # the registered model card
    import mlflow

    from zaya_pipeline.tracking import using_tracking_uri

    with using_tracking_uri(uri):  # the version carries the same folder as an artifact
        carried = Path(mlflow.artifacts.download_artifacts(f"{model_uri}/artifacts/hf"))
    assert sorted(p.name for p in carried.iterdir()) == sorted(p.name for p in folder.iterdir())
    assert (carried / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    theirs = hf_side("document 1:", [folder])[str(folder)]
    ours = zaya_generate(
        ["--model", model_uri, "--tracking-uri", uri, "--max-new-tokens", str(NEW_TOKENS), "document 1:"]
    )
    cut = theirs["generated"][len(theirs["ids"]) :]
    eos = workspace["eos"]
    expected = cut[: cut.index(eos)] if eos in cut else cut
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(workspace["root"] / "tokenizer" / "tokenizer.json"))
    assert ours == [tok.decode(expected, skip_special_tokens=True)]


def test_bad_arguments_are_one_line_errors_that_touch_nothing(tmp_path, tokenizer_dir):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not an earlier zaya export"):
        export(["--model", str(tmp_path / "model.pt"), "--out", str(keep)])
    assert (keep / "notes.txt").read_text() == "mine"
    with pytest.raises(DataError, match="--model: .*model.pt is missing"):
        export(
            [
                "--model",
                str(tmp_path / "model.pt"),
                "--tokenizer",
                str(tokenizer_dir),
                "--out",
                str(tmp_path / "x"),
            ]
        )
    with pytest.raises(ConfigError, match="expected models:/"):
        export(["--model", "s3://bucket/model", "--out", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()


def test_an_earlier_export_is_replaced_whole(tmp_path, tokenizer_dir):
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    model_pt = variant_model("gqa-linear", vocab, tmp_path / "model.pt")
    args = ["--model", str(model_pt), "--tokenizer", str(tokenizer_dir), "--out", str(tmp_path / "hf")]
    export(args)
    stale = tmp_path / "hf" / "model-00001-of-00002.safetensors"  # a shard of an earlier, bigger export
    stale.write_bytes(b"from before")
    export(args)
    assert not stale.exists()
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_zaya.ZayaForCausalLM"
    assert dataclasses.asdict(load_model(model_pt)[1]) == config["zaya"]


HARNESS_TASK = """task: zaya_arc_easy_hf
dataset_path: json
dataset_kwargs:
  data_files:
    test: DOCS
test_split: test
output_type: multiple_choice
doc_to_text: "{{context}}"
doc_to_choice: "{{choices}}"
doc_to_target: gold
target_delimiter: " "
metric_list:
  - metric: acc
  - metric: acc_norm
"""


@pytest.mark.slow
def test_the_harness_hf_model_on_an_export_scores_arc_easy_as_our_evaluate_stage(
    tmp_path, workspace, monkeypatch
):
    """lm-evaluation-harness's own ``hf`` model (transformers underneath) on the exported folder, with a local
    task built from our pinned ARC-Easy documents, gives the evaluate stage's ``acc`` and ``acc_norm``."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager
    from tokenizers import Tokenizer

    from zaya_pipeline.eval.task_data import eval_data
    from zaya_pipeline.eval.tasks import bare_choice, load_task, score_choices, task_metrics

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root, limit = workspace["root"], 60
    cfg = dataclasses.replace(workspace["cfg"])
    cfg.paths = dataclasses.replace(cfg.paths, eval_tasks=str(tmp_path / "eval_tasks"))
    cfg.eval = dataclasses.replace(cfg.eval, tasks=["arc_easy"])
    eval_data(cfg)
    items = load_task(tmp_path / "eval_tasks" / "arc_easy.jsonl.gz", limit=limit)
    tok = Tokenizer.from_file(str(root / "tokenizer" / "tokenizer.json"))
    # ZAYA1's architecture, exported in transformers' own zaya format, with a window that holds every
    # request (the harness refuses longer ones)
    model_pt = variant_model("zaya", tok.get_vocab_size(), tmp_path / "model.pt", max_seq_len=1024)
    model, _ = load_model(model_pt)
    ours = task_metrics(items, score_choices(model, tok, items, workspace["eos"], 8))  # what evaluate runs
    assert ours["acc_norm"] != ours["acc_per_byte"] or ours["acc"] != ours["acc_norm"]  # not all one number

    folder = export(
        ["--model", str(model_pt), "--tokenizer", str(root / "tokenizer"), "--out", str(tmp_path / "hf")]
    )
    docs = tmp_path / "docs.jsonl"
    rows = [
        {"context": it.contexts[0], "choices": [bare_choice(c) for c in it.continuations], "gold": it.gold}
        for it in items
    ]
    docs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "task.yaml").write_text(HARNESS_TASK.replace("DOCS", str(docs)))
    from lm_eval.models.huggingface import HFLM  # the harness's own "hf" model (transformers underneath)

    assert json.loads((folder / "config.json").read_text())["model_type"] == "zaya"  # no remote code
    args = {"pretrained": str(folder), "add_bos_token": True, "dtype": "float32"}
    lm = HFLM.create_from_arg_obj(args, {"batch_size": 8, "device": "cpu"})  # as simple_evaluate builds it
    out = lm_eval.simple_evaluate(
        model=lm, tasks=["zaya_arc_easy_hf"], task_manager=TaskManager(include_path=str(tmp_path))
    )
    theirs = out["results"]["zaya_arc_easy_hf"]
    assert theirs["acc,none"] == pytest.approx(ours["acc"], abs=1e-9)
    assert theirs["acc_norm,none"] == pytest.approx(ours["acc_norm"], abs=1e-9)

"""The lm-evaluation-harness adapter (optional dependency: runs when ``lm_eval`` is installed)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from test_tasks import DOCS, MAX_LEN, make_model, naive_loglik  # noqa: E402

from zaya_pipeline.config import TokenizerConfig  # noqa: E402
from zaya_pipeline.data.tokenizer import pad_vocab, train_bpe  # noqa: E402
from zaya_pipeline.eval.harness import ZayaHarnessLM  # noqa: E402
from zaya_pipeline.model.saved_model import save_model  # noqa: E402


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    tok = train_bpe(DOCS, TokenizerConfig(vocab_size=300))
    pad_vocab(tok, 64)
    tok.save(str(root / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    (root / "meta.json").write_text(json.dumps({"eos_id": eos, "vocab_size": tok.get_vocab_size()}))
    model = make_model(tok.get_vocab_size(), "gqa")
    save_model(root / "model.pt", model, model.cfg)
    return ZayaHarnessLM(model_path=str(root / "model.pt"), tokenizer_dir=str(root), batch_size=2), tok, eos


def _inst(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def test_loglikelihood_matches_a_naive_forward_and_flags_greedy_continuations(harness):
    lm, tok, eos = harness
    pairs = [("Question: is the café open?\nAnswer:", " yes"), ("", " the dog"), ("the dog said", " naïve")]
    got = lm.loglikelihood([_inst("loglikelihood", c, x) for c, x in pairs])
    for (ctx, cont), (loglik, _) in zip(pairs, got, strict=True):
        assert loglik == pytest.approx(naive_loglik(lm.zaya, tok, eos, ctx, cont), rel=1e-5, abs=1e-5)
    # The model's own argmax token is greedy by definition.
    ctx_ids = [eos, *tok.encode("the dog said", add_special_tokens=False).ids]
    with torch.no_grad():
        best = int(lm.zaya(torch.tensor([ctx_ids])).logits[0, -1].argmax())
    [(_, greedy)] = lm.loglikelihood([_inst("loglikelihood", "the dog said", tok.decode([best]))])
    assert greedy is True
    [(_, not_greedy)] = lm.loglikelihood([_inst("loglikelihood", "the dog said", " café café café")])
    assert not_greedy is False


def test_rolling_loglikelihood_of_a_short_string_is_its_full_loglik(harness):
    lm, tok, eos = harness
    text = " the café at 3"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert len(ids) < MAX_LEN
    [rolled] = lm.loglikelihood_rolling([_inst("loglikelihood_rolling", text)])
    assert rolled == pytest.approx(naive_loglik(lm.zaya, tok, eos, "", text), rel=1e-5, abs=1e-5)
    long_text = " ".join(DOCS[:3])  # many windows of MAX_LEN tokens
    [long] = lm.loglikelihood_rolling([_inst("loglikelihood_rolling", long_text)])
    assert long < rolled < 0


def test_generate_until_stops_at_the_stop_string(harness):
    lm, _, _ = harness
    [free] = lm.generate_until([_inst("generate_until", "the dog", {"max_gen_toks": 8})])
    assert isinstance(free, str)
    stop = free[len(free) // 2 :] if len(free) > 1 else "\n"
    [cut] = lm.generate_until([_inst("generate_until", "the dog", {"max_gen_toks": 8, "until": [stop]})])
    assert stop not in cut and free.startswith(cut)

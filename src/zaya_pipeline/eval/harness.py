"""Run any lm-evaluation-harness task on a zaya model: an ``lm_eval`` LM subclass (optional dependency).

    pip install -e ".[lmeval]"        # lm_eval==0.4.13
    import lm_eval
    from zaya_pipeline.eval.harness import ZayaHarnessLM
    lm = ZayaHarnessLM(model_path="artifacts/train/model.pt", tokenizer_dir="artifacts/tokenizer")
    lm_eval.simple_evaluate(model=lm, tasks=["lambada_openai"], limit=100)

Importing this module registers the model as ``zaya`` for ``lm_eval.simple_evaluate(model="zaya",
model_args="model_path=...,tokenizer_dir=...")``. The harness's own tasks download their data from the HF
hub, which is not reachable on the machines this project was built on; the offline tasks of the evaluate
stage do not need the harness. Scoring is the evaluate stage's (``eval/tasks.py``): EOS is the BOS of every
context, context and continuation are encoded separately, long contexts lose tokens from the left.
"""

from __future__ import annotations

from pathlib import Path

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from zaya_pipeline.eval.tasks import fit_window, score_token_requests
from zaya_pipeline.model.generate import document_start
from zaya_pipeline.utils import read_json


@register_model("zaya")
class ZayaHarnessLM(LM):
    def __init__(self, model_path: str, tokenizer_dir: str, batch_size: int | str = 16, device: str = "cpu"):
        super().__init__()
        from tokenizers import Tokenizer

        from zaya_pipeline.model.saved_model import load_model

        self.zaya, _ = load_model(model_path, map_location=device)
        self.zaya.eval()
        self.tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        meta = read_json(Path(tokenizer_dir) / "meta.json")
        self.eos_id = int(meta["eos_id"])
        self.start = document_start(self.eos_id, meta.get("bos_id"))  # before every context
        self.batch_size = int(batch_size)
        self._device = device
        self.max_len = self.zaya.cfg.max_seq_len

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _score(self, reqs: list[tuple[list[int], int]]) -> list[tuple[float, bool]]:
        return score_token_requests(self.zaya, reqs, self.eos_id, self.batch_size, self._device)

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        """(Σ ln p(continuation | context), is the continuation the greedy one) per request."""
        reqs = []
        for context, continuation in (r.args for r in requests):
            reqs.append(
                fit_window([*self.start, *self._encode(context)], self._encode(continuation), self.max_len)
            )
        return self._score(reqs)

    def loglikelihood_rolling(self, requests) -> list[float]:
        """Σ ln p of every token of each string (after the document start), in windows of ``max_seq_len``
        tokens, each token predicted once with as much preceding context as fits."""
        out = []
        for (text,) in (r.args for r in requests):
            tokens = [*self.start, *self._encode(text)]
            first = len(self.start)
            windows = [
                fit_window(tokens[:start], tokens[start : start + self.max_len], self.max_len)
                for start in range(first, len(tokens), self.max_len)
            ]
            out.append(sum(loglik for loglik, _ in self._score(windows)) if windows else 0.0)
        return out

    def generate_until(self, requests) -> list[str]:
        """Greedy (or, with ``do_sample`` and ``temperature`` > 0, sampled) continuation, cut at the first
        ``until`` string, at most ``max_gen_toks`` (default 64) new tokens; the context keeps its last tokens
        when it does not fit beside them."""
        import torch

        from zaya_pipeline.model.generate import generate

        out = []
        device = next(self.zaya.parameters()).device
        for context, kwargs in (r.args for r in requests):
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            temperature = float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample", False) else 0.0
            n = max(1, min(int(kwargs.get("max_gen_toks", 64)), self.max_len - 1))
            ids = [*self.start, *self._encode(context)][-(self.max_len - n) :]
            ids_BT = torch.tensor([ids], dtype=torch.long, device=device)
            with torch.inference_mode():
                new = generate(self.zaya, ids_BT, n, temperature, 1.0, self.eos_id)[0, len(ids) :].tolist()
            new = new[: new.index(self.eos_id)] if self.eos_id in new else new
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            cuts = [text.index(stop) for stop in until if stop and stop in text]
            out.append(text[: min(cuts)] if cuts else text)
        return out

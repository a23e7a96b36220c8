"""Autoregressive decoding: greedy or temperature + nucleus (top-p) sampling, incremental with a KV cache
(the prompt is prefilled once, then each step runs only the new token).

Shape legend:
    B  batch    T  tokens    V  vocabulary
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from zaya_pipeline.model.transformer import ZayaLM


def sample_top_p(
    logits_BV: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> torch.Tensor:
    """Sample from the smallest set of tokens whose probability mass reaches ``top_p`` (at least one)."""
    probs_BV = (logits_BV.float() / temperature).softmax(dim=-1)
    if top_p < 1.0:
        sorted_BV, idx_BV = probs_BV.sort(dim=-1, descending=True)
        # Drop a token when the mass before it already reaches top_p; the most likely token always stays.
        drop_BV = sorted_BV.cumsum(dim=-1) - sorted_BV >= top_p
        sorted_BV = sorted_BV.masked_fill(drop_BV, 0.0)
        probs_BV = torch.zeros_like(probs_BV).scatter(-1, idx_BV, sorted_BV)
    return torch.multinomial(probs_BV, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model: ZayaLM,
    input_ids_BT: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    check_stop: Callable[[], None] | None = None,
) -> torch.LongTensor:
    """The prompt followed by up to ``max_new_tokens`` new tokens, shape (B, T + n).

    ``temperature == 0`` decodes greedily. A row that has produced ``eos_id`` is padded with ``eos_id``
    afterwards; decoding stops early once every row has. Contexts longer than ``model.cfg.max_seq_len``
    keep only their last ``max_seq_len`` tokens: once the cache is full, each step re-prefills that window
    (positions restart at 0). ``use_cache=False`` re-runs the whole context every step (the reference).
    ``check_stop`` is called before every step and raises to abandon decoding (a served request's deadline).
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    ids_BT = input_ids_BT.long()
    done_B = torch.zeros(ids_BT.shape[0], dtype=torch.bool, device=ids_BT.device)
    max_len = model.cfg.max_seq_len
    cache = None
    for _ in range(max_new_tokens):
        if check_stop is not None:
            check_stop()
        if not use_cache:
            logits_BV = model(ids_BT[:, -max_len:]).logits[:, -1]
        elif cache is None or cache.length >= max_len:
            cache = model.new_cache()
            logits_BV = model(ids_BT[:, -max_len:], cache=cache).logits[:, -1]
        else:  # only the token appended last is new to the cache
            logits_BV = model(ids_BT[:, -1:], cache=cache).logits[:, -1]
        if temperature == 0.0:
            next_B = logits_BV.argmax(dim=-1)
        else:
            next_B = sample_top_p(logits_BV, temperature, top_p, generator)
        if eos_id is not None:
            next_B = next_B.masked_fill(done_B, eos_id)
            done_B |= next_B == eos_id
        ids_BT = torch.cat([ids_BT, next_B[:, None]], dim=1)
        if eos_id is not None and bool(done_B.all()):
            break
    return ids_BT


def document_start(eos_id: int, bos_id: int | None = None) -> list[int]:
    """The ids in front of every training document's text: the previous document's EOS, then the BOS when
    the tokenizer has one (``tokenizer.bos_token``, or an imported ZAYA1 tokenizer's). Prompts and scored
    contexts start with them too."""
    return [eos_id] if bos_id is None else [eos_id, bos_id]


def continue_prompts(
    model: ZayaLM,
    tokenizer,
    eos_id: int,
    prompts: list[str],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    device: str | torch.device | None = None,
    bos_id: int | None = None,
    check_stop: Callable[[], None] | None = None,
) -> list[str]:
    """The decoded continuation of each prompt (after ``document_start``, as every training document;
    cut at the first EOS). ``tokenizer`` is a ``tokenizers.Tokenizer``; prompts are decoded one by one;
    ``check_stop`` as in :func:`generate`."""
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    generator = torch.Generator(device=device).manual_seed(int(seed))
    out = []
    for prompt in prompts:
        ids = [*document_start(eos_id, bos_id), *tokenizer.encode(prompt, add_special_tokens=False).ids]
        ids_BT = torch.tensor([ids], dtype=torch.long, device=device)
        full_BT = generate(
            model, ids_BT, max_new_tokens, temperature, top_p, eos_id, generator, check_stop=check_stop
        )
        new = full_BT[0, len(ids) :].tolist()
        new = new[: new.index(eos_id)] if eos_id in new else new
        out.append(tokenizer.decode(new, skip_special_tokens=True))
    return out

"""A short Markdown model card, stored as the registered version's description (shown by ``mlflow ui``)."""

from __future__ import annotations

from zaya_pipeline.config import ModelConfig


def model_card(
    model_cfg: ModelConfig,
    metrics: dict,
    run_id: str,
    git_commit: str | None,
    data: dict | None = None,
    training: dict | None = None,
) -> str:
    """``data``: token counts per split (tokenize meta.json); ``training``: the train stage's report plus the
    optimizer and schedule names."""
    from zaya_pipeline.model.hf_format import unsupported
    from zaya_pipeline.model.sizing import num_active_params, num_params

    moe, attn = model_cfg.moe, model_cfg.attention
    kv_heads = attn.n_kv_heads or attn.n_heads
    why = unsupported(model_cfg)
    architecture = (
        "ZAYA1's architecture: transformers' own `zaya` model (`ZayaForCausalLM`) computes it"
        if why is None
        else f"a ZAYA1-style ablation arm, not transformers' `zaya` ({why})"
    )
    lines = [
        f"# {model_cfg.name}: Mixture-of-Experts LM",
        "",
        f"* architecture: {architecture}",
        f"* {model_cfg.n_layers} layers, d_model {model_cfg.d_model}, {attn.type.upper()} attention with "
        f"{attn.n_heads} query / {kv_heads} key-value heads, {moe.router.type} router, "
        f"{moe.num_experts} experts{' + skip' if moe.skip_expert else ''} (top-{moe.top_k}, "
        f"hidden {moe.expert_hidden}), vocabulary "
        f"{model_cfg.vocab_size}, context {model_cfg.max_seq_len} tokens",
        f"* parameters: {num_params(model_cfg):,} total, {num_active_params(model_cfg):,} active per token",
        f"* held-out: loss {metrics['val_loss']:.4f} nats/token, perplexity {metrics['perplexity']:.2f}, "
        f"{metrics['bits_per_byte']:.4f} bits/byte over {metrics['tokens']:,} tokens",
        f"* training run `{run_id}`" + (f", code at git commit `{git_commit}`" if git_commit else ""),
    ]
    if data:
        lines.append(
            f"* data: {data.get('train', '?'):,} training / {data.get('val', '?'):,} validation tokens"
        )
    if training:
        lines.append(
            f"* training: {training.get('steps', '?')} steps, {training.get('tokens_seen', 0):,} tokens, "
            f"{training.get('optimizer', '?')} optimizer, {training.get('schedule', '?')} LR schedule"
        )
    lines += task_table(metrics.get("tasks", {}))
    lines += [
        "",
        "Limits: a research model of this pipeline, trained on the corpus above only. It has no safety "
        "tuning, and its task scores are zero-shot figures on a limited document count (see n).",
        "",
        "Load with `mlflow.pyfunc.load_model(uri).predict(['a prompt'], params={'max_new_tokens': 32})`.",
    ]
    return "\n".join(lines)


def task_table(tasks: dict) -> list[str]:
    """Markdown rows of the zero-shot task results (accuracy ± standard error beside chance)."""
    if not tasks:
        return []
    rows = ["", "| task | n | acc | acc_norm (per character) | chance |", "|---|---|---|---|---|"]
    for name, m in tasks.items():
        rows.append(
            f"| {name} | {m['n']} | {m['acc']:.3f} ± {m['acc_stderr']:.3f} | "
            f"{m['acc_norm']:.3f} ± {m['acc_norm_stderr']:.3f} | {m['chance']:.3f} |"
        )
    return rows

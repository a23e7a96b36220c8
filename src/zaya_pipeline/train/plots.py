"""The train stage's figures, drawn from the rows the telemetry callbacks keep (the same rows as the DVC
plots CSVs). One function per figure returns a matplotlib ``Figure``; each callback saves its own as PNGs
(``train/callbacks/``), ``write_train_plots`` saves them all from the rows. Figures are built on
``matplotlib.figure.Figure`` directly (the Agg canvas, no pyplot): no GUI backend, no global figure list to
leak.

Rows (as in ``train/callbacks/``):
    train   (step, loss, lr, tokens_per_s)      val     (step, val_loss)
    load    (step, layer, expert, fraction)     bias    (step, layer, expert, bias)
    mfu     (step, mfu, tflops_per_device)      schedule (step, lr_multiplier, tokens_per_step)
    throughput (step, tokens_per_s)

Shape legend: L layers, E router choices (the experts, then the skip expert if any), S logged steps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

DPI = 110
TRAIN_PLOTS = ("loss", "lr", "throughput", "expert_load", "router_bias")  # the PNGs write_train_plots makes
MAX_LAYER_PANELS = 4  # heatmap / trajectory panels: the first, the last and evenly spaced layers between


def _grid(rows: list[tuple], value: int = 3) -> tuple[list[int], np.ndarray]:
    """(steps, values_LES) from (step, layer, expert, value) rows; NaN where a cell has no row."""
    steps = sorted({int(r[0]) for r in rows})
    L, E = 1 + max(int(r[1]) for r in rows), 1 + max(int(r[2]) for r in rows)
    at = {s: i for i, s in enumerate(steps)}
    values_LES = np.full((L, E, len(steps)), np.nan)
    for r in rows:
        values_LES[int(r[1]), int(r[2]), at[int(r[0])]] = r[value]
    return steps, values_LES


def _edges(steps: list[int]) -> np.ndarray:
    """Cell edges for a heatmap over (possibly unevenly) logged steps: halfway between neighbours."""
    s = np.asarray(steps, dtype=float)
    if len(s) == 1:
        return np.array([s[0] - 0.5, s[0] + 0.5])
    mid = (s[1:] + s[:-1]) / 2
    return np.concatenate([[2 * s[0] - mid[0]], mid, [2 * s[-1] - mid[-1]]])


def _panel_layers(num_layers: int) -> list[int]:
    if num_layers <= MAX_LAYER_PANELS:
        return list(range(num_layers))
    return sorted({int(round(x)) for x in np.linspace(0, num_layers - 1, MAX_LAYER_PANELS)})


def _choice_names(num_choices: int, skip_expert: bool) -> list[str]:
    experts = num_choices - int(skip_expert)
    return [f"e{e}" for e in range(experts)] + (["skip"] if skip_expert else [])


def loss_figure(train_rows: list[tuple], val_rows: list[tuple], unigram_nats: float | None = None) -> Figure:
    """Training loss (mean over each logging interval) and validation loss, beside the unigram baseline."""
    fig = Figure(figsize=(7.5, 4), layout="constrained")
    ax = fig.subplots()
    ax.plot([r[0] for r in train_rows], [r[1] for r in train_rows], color="tab:blue", label="train")
    if val_rows:
        ax.plot([r[0] for r in val_rows], [r[1] for r in val_rows], "o-", color="tab:red", label="validation")
    if unigram_nats is not None:
        ax.axhline(unigram_nats, color="gray", linestyle="--", label="unigram baseline (validation)")
    ax.set(xlabel="optimizer step", ylabel="cross-entropy (nats / token)", title="Loss")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def lr_figure(train_rows: list[tuple]) -> Figure:
    """The learning rate each logged step used (the first parameter group)."""
    fig = Figure(figsize=(7.5, 3.5), layout="constrained")
    ax = fig.subplots()
    ax.plot([r[0] for r in train_rows], [r[2] for r in train_rows], color="tab:green")
    ax.set(xlabel="optimizer step", ylabel="learning rate (first param group)", title="Learning rate")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    ax.grid(alpha=0.3)
    return fig


def throughput_figure(rows: list[tuple], mfu_rows: list[tuple] = ()) -> Figure:
    """Training tokens per second over all processes (per logging interval, validation time excluded), with
    its median; MFU on a second axis when it was measured. ``rows``: step first, tokens/s last (train or
    throughput rows)."""
    fig = Figure(figsize=(7.5, 3.8), layout="constrained")
    ax = fig.subplots()
    steps, tps = [r[0] for r in rows], [r[-1] for r in rows]
    ax.plot(steps, tps, color="tab:purple", marker=".", label="tokens/s")
    median = float(np.median(tps))
    ax.axhline(median, color="tab:purple", linestyle=":", label=f"median {median:,.0f}")
    ax.set(xlabel="optimizer step", ylabel="tokens / s (all processes)", title="Training throughput")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if mfu_rows:
        ax2 = ax.twinx()
        ax2.plot([r[0] for r in mfu_rows], [100 * r[1] for r in mfu_rows], color="tab:orange", label="MFU")
        ax2.set_ylabel("MFU (% of peak FLOP/s)", color="tab:orange")
        ax2.set_ylim(bottom=0)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="lower right")
    return fig


def expert_load_figure(load_rows: list[tuple], skip_expert: bool = False) -> Figure:
    """Top: max/mean expert load per layer over steps (1 = perfectly balanced; the skip expert left out).
    Below: the share of routed slots per expert over steps, for a few layers (first, last, between)."""
    steps, frac_LES = _grid(load_rows)
    L, E, _ = frac_LES.shape
    experts = E - int(skip_expert)
    layers = _panel_layers(L)
    edges = _edges(steps)
    heights = [max(L, 4)] + [max(E, 2)] * len(layers)
    fig = Figure(figsize=(9, 1.2 + 0.22 * sum(heights) + 0.35 * len(heights)), layout="constrained")
    axes = fig.subplots(len(heights), 1, sharex=True, gridspec_kw={"height_ratios": heights})

    ratio_LS = frac_LES[:, :experts].max(axis=1) * experts / frac_LES[:, :experts].sum(axis=1)
    mesh = axes[0].pcolormesh(edges, np.arange(L + 1) - 0.5, ratio_LS, cmap="magma_r", vmin=1.0)
    fig.colorbar(mesh, ax=axes[0], label="max / mean load", pad=0.01)
    axes[0].set(ylabel="layer", title="Expert load balance (max / mean over experts; 1 = balanced)")
    if L <= 12:
        axes[0].set_yticks(range(L))
    axes[0].invert_yaxis()

    names = _choice_names(E, skip_expert)
    vmax = float(np.nanmax(frac_LES[layers]))
    for ax, layer in zip(axes[1:], layers, strict=True):
        mesh = ax.pcolormesh(
            edges, np.arange(E + 1) - 0.5, frac_LES[layer], cmap="viridis", vmin=0.0, vmax=vmax
        )
        ax.set_yticks(range(E), names if E <= 24 else None)
        ax.set(ylabel=f"layer {layer}\nexpert")
        ax.invert_yaxis()
    fig.colorbar(
        mesh, ax=list(axes[1:]), label=f"share of routed slots (uniform = 1/{E} = {1 / E:.3f})", pad=0.01
    )
    axes[1].set_title("Load per expert")
    axes[-1].set_xlabel("optimizer step")
    if len(steps) <= 12:
        axes[-1].set_xticks(steps)
    return fig


def router_bias_figure(bias_rows: list[tuple], skip_expert: bool = False) -> Figure:
    """The ZAYA1 router's balancing bias per expert over steps, one panel per shown layer. A skip expert's
    bias (on another scale: it starts at ``skip_bias_init``) gets a last panel, one line per layer."""
    steps, bias_LES = _grid(bias_rows)
    L, E, _ = bias_LES.shape
    experts = E - int(skip_expert)
    layers = _panel_layers(L)
    panels = len(layers) + int(skip_expert)
    fig = Figure(figsize=(9, 1.0 + 2.2 * panels), layout="constrained")
    axes = fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    marker = "." if len(steps) <= 30 else None
    for ax, layer in zip(axes, layers, strict=False):
        for e in range(experts):
            ax.plot(steps, bias_LES[layer, e], color=f"C{e % 10}", ls="-" if e < 10 else ":", marker=marker)
        ax.set(ylabel=f"layer {layer}\nbias (added to probs)")
    if experts <= 20:
        names = _choice_names(experts, False)
        fig.legend(axes[0].get_lines(), names, loc="outside right upper", title="expert")
    if skip_expert:
        ax = axes[-1]
        for layer in range(L):
            ax.plot(steps, bias_LES[layer, -1], color=f"C{layer % 10}", marker=marker, label=f"layer {layer}")
        ax.set(ylabel="skip expert\nbias (added to probs)")
        if L <= 12:
            ax.legend(fontsize=8, ncols=min(L, 6))
    for ax in axes:
        ax.axhline(0.0, color="gray", linewidth=0.8)
        ax.grid(alpha=0.3)
    axes[0].set_title("Router balancing bias (> 0: pushed towards an under-loaded expert)")
    axes[-1].set_xlabel("optimizer step")
    return fig


def note_figure(title: str, text: str) -> Figure:
    """A figure that says why there is nothing to draw."""
    fig = Figure(figsize=(7.5, 2.0), layout="constrained")
    ax = fig.subplots()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes)
    return fig


def router_bias_or_note_figure(bias_rows: list[tuple], skip_expert: bool = False) -> Figure:
    """``router_bias.png``: the bias trajectories, or, for a router without a balancing bias (no rows), a note
    that says so (DVC expects every declared plot file to exist)."""
    if bias_rows:
        return router_bias_figure(bias_rows, skip_expert)
    no_bias = "This router has no balancing bias: only model.moe.router.type=zaya1 has one."
    return note_figure("Router balancing bias", no_bias)


def schedule_figure(schedule_rows: list[tuple]) -> Figure:
    """The planned LR multiplier and tokens per optimizer step over the whole run."""
    fig = Figure(figsize=(7.5, 3.5), layout="constrained")
    ax = fig.subplots()
    steps = [r[0] for r in schedule_rows]
    ax.plot(steps, [r[1] for r in schedule_rows], color="tab:blue")
    ax.set(xlabel="optimizer step", title="Planned LR and batch schedule")
    ax.set_ylabel("LR / peak LR", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(steps, [r[2] for r in schedule_rows], color="tab:orange")
    ax2.set_ylabel("tokens per step", color="tab:orange")
    return fig


def save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def write_train_plots(
    out: Path,
    *,
    train_rows: list[tuple],
    val_rows: list[tuple],
    load_rows: list[tuple],
    bias_rows: list[tuple] = (),
    mfu_rows: list[tuple] = (),
    skip_expert: bool = False,
    unigram_nats: float | None = None,
) -> list[Path]:
    """``<name>.png`` under ``out`` for every name of ``TRAIN_PLOTS``; returns their paths. Training always
    logs its last step, so there are train and load rows; a router without a balancing bias has no bias rows,
    and its ``router_bias.png`` says so (DVC expects every declared plot file to exist)."""
    out = Path(out)
    figures = {
        "loss": loss_figure(train_rows, val_rows, unigram_nats),
        "lr": lr_figure(train_rows),
        "throughput": throughput_figure(train_rows, mfu_rows),
        "expert_load": expert_load_figure(load_rows, skip_expert),
        "router_bias": router_bias_or_note_figure(bias_rows, skip_expert),
    }
    return [save(fig, out / f"{name}.png") for name, fig in figures.items()]

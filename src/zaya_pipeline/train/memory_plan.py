"""``zaya plan``: per-device memory and communication of a training step in closed form (docs/memory_plan.md).

The planner builds nothing and runs nothing: it counts bytes from the config (``model.*``, ``parallel.*``,
``train.*``) with the parameter counts of :mod:`zaya_pipeline.model.sizing` and the layout of
:mod:`zaya_pipeline.distributed.parallelize` (experts split over ``ep`` ranks, each expert FSDP-sharded over
``dp_shard / ep``; every other weight FSDP-sharded over ``dp_shard``; ``dp_replicate`` replicas). The
activation formulas follow what the model's code saves for backward, layer by layer (tests check them
against ``profiling.saved_activation_bytes``, and the whole plan against the measured peak of real CPU
training steps).

Sizes are bytes per device; ``1 GB = 1e9 bytes``.

Shape legend:
    N  tokens per micro-batch and device (micro_batch x seq_len)    D  model width    L  layers
    V  vocabulary    H / G / Hd  query heads / kv heads / head width    Q = H Hd    KV = G Hd
    C  CCA's packed q|k channels (Q + KV)    E  router choices    K  top_k    F  expert hidden
    Fs  shared-expert hidden    R  zaya1 router width    c  bytes of an activation element
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from zaya_pipeline.config import ModelConfig, ZayaConfig
from zaya_pipeline.distributed.mesh import MeshSizes, mesh_sizes
from zaya_pipeline.distributed.parallelize import AC_MODES, PARAM_DTYPES
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model.attention import head_dims, rotary_dim
from zaya_pipeline.model.sizing import num_params, with_resolved_vocab
from zaya_pipeline.model.transformer import validate_model_config
from zaya_pipeline.train.precision import with_resolved_precision

GB, MB = 1e9, 1e6  # decimal units, as the devices are sold
DEVICES = {"MI300X": 192 * GB, "H200": 141 * GB, "H100": 80 * GB}  # memory per device
# train.precision -> (bytes of a stored parameter, gradient and optimizer state; 16-bit weight copies?)
PRECISIONS = {
    "32-true": (4, False),
    "32": (4, False),
    "bf16-mixed": (4, True),
    "16-mixed": (4, True),
    "bf16-true": (2, False),
    "bf16-master": (4, True),  # fp32 masters + persistent bf16 copies (the "weight copies" row) for compute
    "16-true": (2, False),
}
FP32, INDEX = 4, 8  # router probabilities / losses are fp32; routing indices int64
# The moments of a step the peak is taken over; each adds what is alive then to weights + optimizer states.
PHASES = {
    "loss": "the loss backward: every saved activation, logits, log-softmax and their two gradients",
    "recompute": "a checkpointed block recomputed in backward, with the logits and the head's gradient",
    "bwd end": "the end of backward: every gradient, the logits and the embedding's gradient buffers",
    "opt step": "the optimizer step: gradients (and Muon's gathered matrix)",
}


@dataclass(frozen=True)
class Layout:
    """How one step is laid out over the devices."""

    world: int
    fsdp: bool  # parallel.strategy=fsdp2 (parallelize_zaya); else each device holds a full replica
    mesh: MeshSizes
    micro_batches: int  # forward/backward passes per optimizer step and device
    param_bytes: int  # a stored (sharded) parameter, its gradient and each optimizer state
    compute_bytes: int  # an activation element and an unsharded FSDP parameter
    autocast: bool


@dataclass
class Plan:
    layout: Layout
    tokens: int  # N
    backend: str  # the expert MLP backend the activations are counted for
    memory: dict[str, dict[str, int]] = field(default_factory=dict)  # component -> AC mode -> bytes
    peak: dict[str, int] = field(default_factory=dict)  # AC mode -> estimated peak bytes
    peak_phase: dict[str, str] = field(default_factory=dict)  # AC mode -> where the peak is
    comm: dict[str, dict[str, int]] = field(default_factory=dict)  # line -> AC mode -> bytes per step


def _checkpointed(n_layers: int, mode: str) -> int:
    """Blocks parallelize_zaya wraps in activation checkpointing: all (full), every 2nd from 0 (selective)."""
    return {"none": 0, "full": n_layers, "selective": (n_layers + 1) // 2}[mode]


# --- layout ------------------------------------------------------------------------------------------------


def _check_keys(cfg: ZayaConfig, m: ModelConfig) -> None:
    p, t = cfg.parallel, cfg.train
    for key in ("devices", "num_nodes"):
        if getattr(p, key) < 1:
            raise ConfigError(f"parallel.{key} must be >= 1, got {getattr(p, key)}")
    for key in ("micro_batch", "seq_len"):
        if getattr(t, key) < 1:
            raise ConfigError(f"train.{key} must be >= 1, got {getattr(t, key)}")
    if t.seq_len > m.max_seq_len:
        raise ConfigError(f"train.seq_len={t.seq_len} is longer than model.max_seq_len={m.max_seq_len}")
    if t.precision not in PRECISIONS:
        raise ConfigError(f"train.precision: the planner knows {list(PRECISIONS)}, got {t.precision!r}")
    if p.param_dtype not in PARAM_DTYPES:
        raise ConfigError(f"parallel.param_dtype must be one of {list(PARAM_DTYPES)}, got {p.param_dtype!r}")
    if p.activation_checkpointing not in AC_MODES:
        raise ConfigError(
            f"parallel.activation_checkpointing must be one of {list(AC_MODES)}, "
            f"got {p.activation_checkpointing!r}"
        )
    if t.optim.name not in ("adamw", "muon"):
        raise ConfigError(f"train.optim.name: unknown optimizer {t.optim.name!r}; choose adamw or muon")


def layout_of(cfg: ZayaConfig, m: ModelConfig) -> Layout:
    """The layout the trainer would run, with every size checked (errors name the config key)."""
    _check_keys(cfg, m)
    p, t = cfg.parallel, cfg.train
    world = p.devices * p.num_nodes
    fsdp = p.strategy == "fsdp2"
    if fsdp:
        mesh = mesh_sizes(p, world, m.moe.num_experts)
    elif p.ep > 1:
        raise ConfigError(f"parallel.ep={p.ep} needs parallel.strategy=fsdp2, got {p.strategy!r}")
    else:  # one device, or Lightning's DDP: a full replica on every device
        mesh = MeshSizes(dp_replicate=world, dp_shard=1, ep=1)
    full = t.global_batch or t.micro_batch * world
    if full % world:
        raise ConfigError(f"train.global_batch={full} is not divisible by the {world} data-parallel ranks")
    param_bytes, autocast = PRECISIONS[t.precision]
    compute = 2 if autocast or param_bytes == 2 else 4
    if fsdp:  # FSDP2 casts the unsharded parameters and the module inputs to param_dtype
        compute = min(compute, PARAM_DTYPES[p.param_dtype].itemsize)
    micro = math.ceil(full // world / t.micro_batch)
    return Layout(world, fsdp, mesh, micro, param_bytes, compute, autocast)


# --- parameters --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counts:
    """Parameter counts (numbers, unsharded, all experts) from model.sizing."""

    total: int
    embedding: int  # token embedding (+ untied output head)
    block: int  # one block, its routed experts included
    experts: int  # one block's routed experts
    layers: int

    @property
    def block_rest(self) -> int:
        return self.block - self.experts

    @property
    def root(self) -> int:
        """Weights outside the blocks (embedding, head, final norm): the root FSDP unit."""
        return self.total - self.layers * self.block


def counts(m: ModelConfig) -> Counts:
    total, body = num_params(m), num_params(m, include_embedding=False)
    block = (body - m.d_model) // m.n_layers  # the final norm is the only weight outside the blocks
    experts = m.moe.num_experts * 3 * m.d_model * m.moe.expert_hidden  # gate|up (D x 2F) + down (F x D)
    return Counts(total, total - body, block, experts, m.n_layers)


def optimizer_states(cfg: ZayaConfig, m: ModelConfig, ep: int = 1) -> tuple[int, int]:
    """(numbers in the optimizer states of the unsharded model, the largest Muon parameter of one device
    before FSDP sharding: an expert stack holds E / ep experts there).

    AdamW keeps exp_avg and exp_avg_sq per parameter; Muon keeps one momentum buffer per parameter of its
    groups. Which parameters go to Muon is decided by the trainer's own ``assign_param_groups`` over
    ``train.optim.param_groups``, on a model built on the meta device (no memory, no compute)."""
    if cfg.train.optim.name == "adamw":
        return 2 * num_params(m), 0
    import torch

    from zaya_pipeline.model.transformer import ZayaLM
    from zaya_pipeline.train.optim import assign_param_groups

    with torch.device("meta"):
        model = ZayaLM(m)
    states = largest = 0
    for group in assign_param_groups(model, cfg.train.optim):
        muon = group.optimizer == "muon"
        for name, p in zip(group.names, group.params, strict=True):
            states += p.numel() * (1 if muon else 2)
            if muon:
                largest = max(largest, p.numel() // (ep if ".experts." in name else 1))
    return states, largest


# --- activations -------------------------------------------------------------------------------------------


def attention_saved(m: ModelConfig, B: int, T: int, c: int) -> int:
    """Bytes one attention layer saves for backward, its input (the normed x) included."""
    H, G, Hd = head_dims(m)
    N, Q, KV = B * T, H * Hd, G * Hd
    lse = N * H * FP32  # SDPA's log-sum-exp
    rope = 2 * T * (rotary_dim(m) // 2) * FP32  # the layer's cos and sin tables (fp32, shared by q and k)
    if m.attention.type != "cca":
        # x_norm (qkv input), qkv output (SDPA's v is a view of it), RoPE's new q and k, SDPA's output and
        # its (B, T, Q) copy. Without rotated channels q and k stay (B, T)-major views of qkv, SDPA's output
        # follows their layout and the out projection takes a view of it: no RoPE outputs and no copy.
        roped = 2 * Q + KV if rotary_dim(m) else 0
        return N * c * (m.d_model + Q + 2 * KV + Q + roped) + lse + rope
    C = Q + KV
    # x_norm; the two conv inputs (P = K0 - 1 + K1 - 1 zero columns in front of the first, K1 - 1 extra
    # outputs of the first); q, k before their L2 norm and per head their norm, its clamp and the scale
    # divided by it; normalized k (the temperature's input); SDPA's q, k and the value streams; SDPA out and
    # its copy
    K0, K1 = m.attention.conv_kernel_depthwise, m.attention.conv_kernel_grouped
    convs = (2 * N + B * (K0 - 1 + 2 * (K1 - 1))) * C
    norms = 3 * N * (H + G)
    return c * (N * (m.d_model + C + KV + Q + 2 * KV + Q + Q) + convs + norms) + lse + rope


def expert_backend(m: ModelConfig, accelerator: str, c: int) -> str:
    """The backend ``model.moe.expert_backend=auto`` runs (ops.expert_mlp.pick_backend); any accelerator
    but ``cpu`` is taken to be a GPU."""
    if m.moe.expert_backend != "auto":
        return m.moe.expert_backend
    import torch

    from zaya_pipeline.ops.expert_mlp import pick_backend

    dtype = torch.bfloat16 if c == 2 else torch.float32
    device = "cpu" if accelerator == "cpu" else "cuda"
    return pick_backend(device, dtype, (m.d_model, m.moe.expert_hidden))


def moe_saved(m: ModelConfig, N: int, c: int, ep: int = 1, backend: str = "grouped_mm") -> int:
    """Bytes one MoE layer saves, its input (the normed x) included: router and experts, every token routed
    (skip expert and capacity drops are not discounted)."""
    moe, D = m.moe, m.d_model
    E, K, F = moe.num_experts + int(moe.skip_expert), moe.top_k, moe.expert_hidden
    total = N * D * c  # x_norm (router and expert inputs)
    if moe.router.type == "zaya1":
        R = moe.router.dim
        # h (the next EDA state), its RMSNorm (normalized, output, rstd), 2 x (Linear out, GELU out)
        total += 7 * N * R * c + N * FP32
    # fp32 logits (z-loss) and probabilities (softmax), top-k ids, chosen gates, log-sum-exp
    total += N * E * 2 * FP32 + N * K * INDEX + N * FP32 + (N * K * FP32 + N * FP32 if K > 1 else 0)
    rows = N * K
    if backend == "triton":  # gate|up and two int32 routing maps (x and the gates are saved as they are)
        total += rows * 2 * F * c + rows * INDEX
    elif backend == "grouped_mm":  # gathered rows, gate|up, h; sort order, token ids; gates
        total += rows * (D + 3 * F) * c + 2 * rows * INDEX + rows * FP32
    else:  # loop: gathered rows, per expert gate|up, silu(gate), h; the outputs, weighted; gates, indices
        total += rows * (3 * D + 4 * F + 1) * c + 2 * rows * INDEX
    if ep > 1:  # the combine's received rows and gates, the send order and token ids
        total += rows * (D + 1) * c + 2 * rows * INDEX
    if moe.shared_expert_hidden:  # gate|up, silu(gate), h
        total += 4 * N * moe.shared_expert_hidden * c
    return total


def block_saved(m: ModelConfig, B: int, T: int, c: int, ep: int = 1, backend: str = "grouped_mm") -> int:
    """Bytes one block saves for backward without checkpointing: per RMSNorm its input, normalized input
    (the weight's gradient) and rstd; attention; MoE; with residual scaling, per residual add the biased
    sub-block output and the biased residual (the scales' inputs: ``(f + b) * a``)."""
    N, D = B * T, m.d_model
    norms = 2 * (2 * N * D * c + N * FP32)
    scaled = 4 * N * D * c if m.residual_scaling else 0
    return norms + attention_saved(m, B, T, c) + moe_saved(m, N, c, ep, backend) + scaled


def checkpointed_block(m: ModelConfig, N: int, c: int) -> int:
    """What a checkpointed block keeps: its inputs (x, and the zaya1 router's EDA state)."""
    R = m.moe.router.dim if m.moe.router.type == "zaya1" else 0
    return N * (m.d_model + R) * c


def activations(
    m: ModelConfig, B: int, T: int, c: int, mode: str, ep: int = 1, backend: str = "grouped_mm"
) -> tuple[int, int]:
    """(bytes saved over the whole forward, extra bytes while one checkpointed block is recomputed)."""
    L, N = m.n_layers, B * T
    ckpt = _checkpointed(L, mode)
    full, kept = block_saved(m, B, T, c, ep, backend), checkpointed_block(m, N, c)
    head = 3 * N * m.d_model * c + N * FP32  # the final norm's input, normalized, output; rstd
    head += N * m.d_model * c if m.residual_scaling else 0  # the input scaling's biased embedding
    return ckpt * kept + (L - ckpt) * full + head, full if ckpt else 0


def logits_bytes(m: ModelConfig, N: int, c: int) -> tuple[int, int]:
    """(peak, kept): the (N, V) logits in the compute dtype live until the step ends; the fp32 loss adds
    log-softmax's output and, in backward, its gradient and the logits' fp32 gradient."""
    NV = N * m.vocab_size
    return NV * (c + 3 * FP32), NV * c


# --- memory ------------------------------------------------------------------------------------------------


def fsdp_buffers(cnt: Counts, lay: Layout) -> tuple[int, int]:
    """(bytes live during forward and backward, unsharded gradients kept between micro-batches) of FSDP2.

    The root (embedding, head, final norm) stays unsharded from its forward to its backward (FSDP2 does not
    reshard the root after forward); a block's weights, its E / ep local experts in full, are unsharded for
    it and for the prefetched next block; in backward one block's unsharded gradients exist too, plus their
    fp32 copy for the reduce-scatter when param_dtype is 16 bit. With gradient sync off between
    micro-batches FSDP2 keeps every unsharded gradient, upcast to the fp32 reduce dtype."""
    if not lay.fsdp:
        return 0, 0
    pd = lay.compute_bytes
    block = cnt.block_rest + cnt.experts // lay.mesh.ep
    live = cnt.root * pd + 2 * block * pd + block * (pd + (FP32 if pd != FP32 else 0))
    accumulated = (cnt.root + cnt.layers * block) * FP32 if lay.micro_batches > 1 else 0
    return live, accumulated


def _embedding_grads(m: ModelConfig, lay: Layout) -> tuple[int, int]:
    """(bytes held through the blocks' backward, extra bytes at the end of backward) of the embedding and
    head gradients. The logits' weight gradient (V x D) is made by the loss backward and held to the end:
    tied, in autograd's buffer until the embedding's own dense gradient arrives and the two are summed;
    under FSDP, unsharded until the root's reduce-scatter. Untied and unsharded it is the .grad itself."""
    VD = m.vocab_size * m.d_model
    if lay.fsdp:
        return VD * lay.compute_bytes, (3 if m.tie_embeddings else 2) * VD * lay.compute_bytes
    if m.tie_embeddings:  # head gradient + dense embedding gradient + their sum, less the .grad counted
        return VD * lay.param_bytes, 2 * VD * lay.param_bytes
    return 0, 0


def _step_rows(lay: Layout, cnt: Counts, states: int) -> dict[str, int]:
    """The rows that do not depend on the AC mode, per device (``states``: optimizer-state numbers)."""
    shard, ep = lay.mesh.dp_shard, lay.mesh.ep
    live_fsdp, accumulated = fsdp_buffers(cnt, lay)
    # autocast caches a 16-bit copy of every weight it casts (the local experts only, under EP) until its
    # context exits, and the trainer's whole step, optimizer included, runs inside it
    local = cnt.total - cnt.layers * (cnt.experts - cnt.experts // ep)
    return {
        "parameters": cnt.total * lay.param_bytes // shard,
        "gradients": cnt.total * lay.param_bytes // shard,
        "optimizer states": states * lay.param_bytes // shard,
        "FSDP unsharded weights + grads": live_fsdp,
        "FSDP accumulated unsharded grads": accumulated,
        "autocast weight copies": local * 2 if lay.autocast else 0,  # or bf16-master's bf16 copies
    }


def memory_plan(cfg: ZayaConfig) -> Plan:
    """Per-device bytes of every component for each activation-checkpointing mode, and the peak.

    The peak is not the sum of the rows: gradients, activations and the loss buffers are not at their
    largest at the same moment. It is the largest of the moments in ``PHASES``."""
    cfg = with_resolved_precision(cfg)
    m = with_resolved_vocab(cfg)
    validate_model_config(m)
    lay, cnt = layout_of(cfg, m), counts(m)
    B, T, c, ep = cfg.train.micro_batch, cfg.train.seq_len, lay.compute_bytes, lay.mesh.ep
    backend = expert_backend(m, cfg.parallel.accelerator, c)
    states, muon_largest = optimizer_states(cfg, m, ep)
    const = _step_rows(lay, cnt, states)
    logits_peak, logits_kept = logits_bytes(m, B * T, c)
    head_held, end_extra = _embedding_grads(m, lay)
    # Muon gathers each sharded matrix in fp32 for Newton-Schulz: the update and ~3 iterates of its size
    step_extra = 4 * muon_largest * FP32
    # accumulating micro-batches without FSDP keeps the gradients through every forward and backward
    held = const["gradients"] if lay.micro_batches > 1 and not lay.fsdp else 0
    fwd_bwd = sum(const[k] for k in ("FSDP unsharded weights + grads", "FSDP accumulated unsharded grads"))
    fwd_bwd += const["autocast weight copies"]
    static = const["parameters"] + const["optimizer states"]
    plan = Plan(lay, B * T, backend)
    for mode in AC_MODES:
        saved, recompute = activations(m, B, T, c, mode, ep, backend)
        rows = {**const, "activations": saved, "recomputed block": recompute, "logits + loss": logits_peak}
        for name, value in rows.items():
            plan.memory.setdefault(name, {})[mode] = value
        phases = {
            "loss": fwd_bwd + held + saved + logits_peak,
            "recompute": fwd_bwd + held + saved + recompute + logits_kept + head_held,
            "bwd end": fwd_bwd + const["gradients"] + logits_kept + end_extra,
            "opt step": const["autocast weight copies"] + const["gradients"] + step_extra,
        }
        phase = max(phases, key=phases.get)
        plan.peak[mode], plan.peak_phase[mode] = static + phases[phase], phase
    plan.comm = communication(m, cnt, lay, B * T)
    return plan


# --- communication -----------------------------------------------------------------------------------------


def _ring(n: int) -> float:
    """Share of a buffer each rank sends in a ring all-gather or reduce-scatter over n ranks."""
    return (n - 1) / n


def communication(m: ModelConfig, cnt: Counts, lay: Layout, N: int) -> dict[str, dict[str, int]]:
    """Bytes each device sends per optimizer step, per AC mode (ring algorithms: an all-gather or a
    reduce-scatter of S bytes over n ranks sends (n - 1) / n S per rank, an all-reduce twice that)."""
    mesh, L, mb, pd = lay.mesh, m.n_layers, lay.micro_batches, lay.compute_bytes
    rows: dict[str, list[float]] = {}  # line -> bytes per mode, in AC_MODES order
    if lay.fsdp:
        rest = (cnt.root + L * cnt.block_rest) * _ring(mesh.dp_shard)
        experts = L * cnt.experts // mesh.ep * _ring(mesh.dp_shard_out_ep)
        root = cnt.root * _ring(mesh.dp_shard)
        # every micro-batch gathers the weights in forward and again in backward (the root only once)
        rows["FSDP all-gather, forward"] = [mb * (rest + experts) * pd] * 3
        rows["FSDP all-gather, backward"] = [mb * (rest + experts - root) * pd] * 3
        # one reduce-scatter per step (gradient sync only on the last micro-batch), in fp32
        rows["FSDP reduce-scatter, fp32 grads"] = [(rest + experts) * FP32] * 3
        if mesh.dp_replicate > 1:
            hsdp = 2 * _ring(mesh.dp_replicate) * cnt.total / mesh.dp_shard * FP32
            rows["HSDP all-reduce over replicas"] = [hsdp] * 3
    elif lay.world > 1:  # DDP all-reduces the gradients after every backward
        rows["DDP all-reduce, grads"] = [mb * 2 * _ring(lay.world) * cnt.total * lay.param_bytes] * 3
    if mesh.ep > 1:
        # per layer and micro-batch: dispatch + combine of N * top_k rows, (ep - 1) / ep of them leave the
        # rank (balanced routing); the dispatch also sends each row's local expert id
        sent = N * m.moe.top_k * (mesh.ep - 1) / mesh.ep
        forward = 2 * sent * m.d_model * pd + sent * INDEX
        ckpt = [_checkpointed(L, mode) for mode in AC_MODES]
        rows["EP all-to-all, forward"] = [mb * L * forward] * 3
        rows["EP all-to-all, recompute"] = [mb * k * forward for k in ckpt]
        rows["EP all-to-all, backward"] = [mb * L * 2 * sent * m.d_model * pd] * 3
    return {name: dict(zip(AC_MODES, map(int, v), strict=True)) for name, v in rows.items()}


# --- output ------------------------------------------------------------------------------------------------


def fits(peak: int) -> dict[str, tuple[bool, float]]:
    """Per named device: (fits, headroom in bytes; negative when it does not fit)."""
    return {name: (peak <= size, size - peak) for name, size in DEVICES.items()}


def format_plan(cfg: ZayaConfig, plan: Plan) -> str:
    """The table ``zaya plan`` prints: a column per AC mode (``*`` = parallel.activation_checkpointing)."""
    lay, mesh, chosen = plan.layout, plan.layout.mesh, cfg.parallel.activation_checkpointing
    unit, scale = ("GB", GB) if max(plan.peak.values()) >= GB else ("MB", MB)
    cols = "".join(f"{mode + ('*' if mode == chosen else ''):>12}" for mode in AC_MODES)
    num = lambda x: f"{x / scale:12.3f}"  # noqa: E731
    if lay.fsdp:
        layout = (
            f"FSDP2 dp_replicate={mesh.dp_replicate} x dp_shard={mesh.dp_shard}, ep={mesh.ep} "
            f"(each expert sharded over {mesh.dp_shard_out_ep})"
        )
    else:
        layout = "replicated (DDP)" if lay.world > 1 else "one device"
    m, precision = with_resolved_vocab(cfg), with_resolved_precision(cfg).train.precision
    lines = [
        f"zaya plan: model={m.name} ({num_params(m) / 1e9:.3f}B params), world size {lay.world}: {layout}",
        f"  {cfg.train.micro_batch} x {cfg.train.seq_len} = {plan.tokens} tokens per micro-batch and device, "
        f"{lay.micro_batches} micro-batch(es) per step; precision {precision}, param_dtype "
        f"{cfg.parallel.param_dtype}, optimizer {cfg.train.optim.name}, expert backend {plan.backend}",
        "",
        "1 GB = 1e9 bytes, 1 MB = 1e6 bytes; * = parallel.activation_checkpointing",
        "",
        f"{f'memory per device ({unit})':<36}{cols}",
    ]
    for name, per_mode in plan.memory.items():
        if any(per_mode.values()):
            lines.append(f"  {name:<34}" + "".join(num(per_mode[mode]) for mode in AC_MODES))
    lines.append(f"  {'total at peak (estimated)':<34}" + "".join(num(plan.peak[mode]) for mode in AC_MODES))
    lines.append(f"  {'  peak at':<34}" + "".join(f"{plan.peak_phase[mode]:>12}" for mode in AC_MODES))
    lines.append(f"  ({plan.peak_phase[chosen]}: {PHASES[plan.peak_phase[chosen]]})")
    lines += ["", f"{f'sent per step and device ({unit})':<36}{cols}"]
    for name, per_mode in plan.comm.items():
        lines.append(f"  {name:<34}" + "".join(num(per_mode[mode]) for mode in AC_MODES))
    if not plan.comm:
        lines.append("  none (one device)")
    lines += ["", f"{'fits at peak? headroom (GB)':<36}{cols}"]
    for name, size in DEVICES.items():
        cells = []
        for mode in AC_MODES:
            ok, headroom = fits(plan.peak[mode])[name]
            cells.append(f"{('fits' if ok else 'NO') + f' {headroom / GB:+.1f}':>12}")
        lines.append(f"  {f'{name} ({size / GB:.0f} GB)':<34}" + "".join(cells))
    return "\n".join(lines)


def plan(cfg: ZayaConfig) -> dict:
    """``zaya plan model=<preset> parallel=<preset> train.micro_batch=...``: print the table and return a
    summary: the peak per AC mode and, for parallel.activation_checkpointing, the fit on each named device."""
    p = memory_plan(cfg)
    print(format_plan(cfg, p))
    chosen = cfg.parallel.activation_checkpointing
    summary: dict = {f"peak_gb_{mode}": round(p.peak[mode] / GB, 3) for mode in AC_MODES}
    summary["comm_gb_per_step"] = round(sum(v[chosen] for v in p.comm.values()) / GB, 3)
    summary.update({f"fits_{name}_{chosen}": ok for name, (ok, _) in fits(p.peak[chosen]).items()})
    return summary

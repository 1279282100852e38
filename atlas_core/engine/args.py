"""EngineArgs: every knob of an engine, shared by the CLI, the server and the offline API."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

#: ``load_format`` values: read the checkpoint, or random weights from config.json alone.
LOAD_FORMATS = ("auto", "dummy")


@dataclass
class EngineArgs:
    """Settings of an :class:`~atlas_core.engine.LLMEngine`.

    Attributes:
        model: local path or Hugging Face id (``None``: the built-in demo model).
        backend: GpuBackend name (default: ``ATLAS_BACKEND``, else cuda when present, else numpy).
        dtype: weight / activation dtype override (``bfloat16``, ``float32``…).
        max_num_seqs: sequences running at once (decoding or mid-prefill).
        max_batch_size: sequences in one step (default ``max_num_seqs``).
        max_prefill_tokens: prompt tokens computed per step (longer prompts are chunked).
        max_seq_len: longest prompt + output (default: the model's limit, capped by the KV cache).
        gpu_memory_utilization: fraction of device memory Atlas may use in total.
        kv_cache_dtype: ``auto`` (the model's dtype), ``bf16``, ``fp8`` (float8_e4m3fn) or
            ``nvfp4`` (16-value groups of e2m1 with e4m3 scales, :mod:`atlas_core.ops.kv_quant`).
        kv_high_precision_layers: layers whose KV stays in the model dtype when
            ``kv_cache_dtype`` is fp8 or nvfp4: ``auto`` (the first and the last attention
            layer), ``none``, or a comma list of layer indices (``"0,35"``); see
            :mod:`atlas_core.engine.kv_layers`.
        block_size: tokens per KV block.
        num_kv_blocks: KV blocks to allocate (overrides the memory-based sizing; tests).
        enable_prefix_caching: reuse KV blocks of identical prompt prefixes.
        cache_dir: where downloaded models are kept.
        seed: seed of the engine's random source (per-request seeds when none is given).
        served_model_name: the model name the server reports.
        max_waiting: requests allowed to wait for a slot before new ones are refused (``None``:
            unbounded).
        revision: model revision (branch, tag or commit) on the Hub.
        num_state_snapshots: hybrid models: recurrent-state snapshots kept for the prefix cache
            (``None``: ``max_num_seqs``; 0: no prefix caching for hybrid models).
        async_scheduling: overlap the host work of a decode step (scheduling, metadata,
            detokenisation, stop checks) with the device work of the previous one (``None``:
            on for backends with ``supports_graphs``). Steps that need the host's view of the
            last token (prefill, guided, penalties, logprobs...) still run synchronously.
        kv_host_gb: GiB of host memory for prefix-cache blocks evicted from the device (0: none).
        kv_offload_dir: directory where evicted prefix-cache blocks persist across restarts
            (``None``: no disk tier).
        kv_offload_gb: most GiB the disk tier keeps (least recently used out first).
        kv_storage: StorageBackend of the disk tier (``auto``: io_uring when installed, else
            posix).
        kv_disk_restore: a prompt's blocks held by the disk tier only are ``auto``: read back
            or recomputed, whichever the measured disk and prefill rates say is faster;
            ``always``: read back; ``never``: recomputed (:mod:`atlas_core.engine.kv_restore`).
        dequantize_weights: load quantized (FP8 / NVFP4) weights dequantized to the model
            dtype instead of keeping them quantized (for backends or formats without kernels).
        scheduling_policy: ``fifo`` or ``slo`` (alias ``slai``): see
            :mod:`atlas_core.engine.scheduling_policy`.
        tbt_deadline_ms: ``slo``: target milliseconds between two tokens of a stream.
        admission_age_cap_ms: ``slo``: a prompt waiting longer than this is admitted before
            shorter ones (the fairness bound of shortest-first admission).
        sampling_presets: JSON file of per-mode sampling presets (see
            :mod:`atlas_core.engine.sampling_presets`).
        max_identical_tool_calls, max_tool_calls, reasoning_loop_guard: agent-loop guard
            defaults for tool-using requests (see :mod:`atlas_core.engine.agent_guards`;
            ``0`` / ``False`` switch one off).
        scrub_tool_markup: the server removes leaked tool-call markup from the content of
            tool-using requests (:mod:`atlas_core.parsers.markup_scrub`).
        speculative_config: speculative decoding (``None``: off): a
            :class:`~atlas_core.engine.spec.SpeculativeConfig`, or vLLM's dict / JSON form
            ``{"method": "ngram" | "mtp", "num_speculative_tokens": K, ...}``.
        tensor_parallel_size: GPUs (worker processes) the model is split over (docs/multi-gpu.md).
        enable_expert_parallel: MoE layers hold whole experts per GPU instead of slices.
        nnodes, node_rank, master_addr, master_port: placement of a run over several machines
            (or the launcher's ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` environment).
        distributed_executor_backend: ``mp`` (worker processes spawned here) or ``ray``.
        distributed_timeout: seconds a rank waits for its peers before the run fails.
        batch_invariant: a request's tokens and logprobs do not depend on what else is in the
            batch (evals, agent replay): the backend takes, for every op, one kernel whose
            per-row rounding ignores the other rows (:meth:`GpuBackend.set_batch_invariant`;
            docs/serving.md, Determinism). Slower on cuda; one GPU, no speculative decoding.
        load_format: ``auto`` (read the checkpoint) or ``dummy`` (vLLM's name): every rank
            builds its part of the model from config.json alone and fills it with random values
            on its own device, so a model too big for the disk (or not downloaded) can be timed;
            the outputs are meaningless (:mod:`atlas_core.model.dummy`).
    """

    model: str | None = None
    backend: str | None = None
    dtype: str | None = None
    max_num_seqs: int = 64
    max_batch_size: int | None = None
    max_prefill_tokens: int = 2048
    max_seq_len: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    kv_high_precision_layers: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None
    enable_prefix_caching: bool = True
    cache_dir: str | None = None
    seed: int = 0
    served_model_name: str | None = None
    max_waiting: int | None = None
    revision: str | None = None
    num_state_snapshots: int | None = None
    async_scheduling: bool | None = None
    kv_host_gb: float = 0.0
    kv_offload_dir: str | None = None
    kv_offload_gb: float = 64.0
    kv_storage: str = "auto"
    kv_disk_restore: str = "auto"
    dequantize_weights: bool = False
    scheduling_policy: str = "fifo"
    tbt_deadline_ms: float = 50.0
    admission_age_cap_ms: float = 2000.0
    sampling_presets: str | None = None
    max_identical_tool_calls: int = 3
    max_tool_calls: int = 64
    reasoning_loop_guard: bool = True
    scrub_tool_markup: bool = True
    speculative_config: Any = None
    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    distributed_executor_backend: str = "mp"
    distributed_timeout: float = 300.0
    batch_invariant: bool = False
    load_format: str = "auto"

    def __post_init__(self) -> None:
        positive = ("max_num_seqs", "max_prefill_tokens", "block_size")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.num_state_snapshots is not None and int(self.num_state_snapshots) < 0:
            raise ValueError(f"num_state_snapshots must be >= 0 (or unset), got "
                             f"{self.num_state_snapshots!r}")
        for name in ("max_batch_size", "max_seq_len", "num_kv_blocks", "max_waiting"):
            value = getattr(self, name)
            if value is not None and int(value) < 1:
                raise ValueError(f"{name} must be >= 1 (or unset), got {value!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization!r}")
        from atlas_core.engine.kv_layers import KV_CACHE_DTYPES, parse_high_precision_layers
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be auto, bf16, fp8 or nvfp4, got "
                             f"{self.kv_cache_dtype!r}")
        parse_high_precision_layers(self.kv_high_precision_layers)
        for name in ("max_identical_tool_calls", "max_tool_calls"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0 (0: off), got {getattr(self, name)!r}")
        for name in ("kv_host_gb", "kv_offload_gb"):
            if not float(getattr(self, name)) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.kv_disk_restore not in ("auto", "always", "never"):
            raise ValueError("kv_disk_restore must be auto, always or never, got "
                             f"{self.kv_disk_restore!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be {' or '.join(LOAD_FORMATS)}, got "
                             f"{self.load_format!r}")
        if self.tensor_parallel_size > 1 or self.nnodes > 1:
            from atlas_core.parallel.launch import parallel_config
            parallel_config(self)
        if self.max_batch_size is None:
            self.max_batch_size = self.max_num_seqs
        from atlas_core.engine.scheduling_policy import create_scheduling_policy
        create_scheduling_policy(self.scheduling_policy, self.tbt_deadline_ms,
                                 self.admission_age_cap_ms)
        if self.sampling_presets:
            from atlas_core.engine.sampling_presets import read_presets_file
            read_presets_file(self.sampling_presets)
        from atlas_core.engine.spec.config import SpeculativeConfig
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        spec = self.speculative_config
        if self.load_format == "dummy" and spec is not None and spec.method == "mtp":
            raise ValueError("load_format dummy builds no MTP head (it reads no checkpoint); "
                             "use n-gram drafts or load the checkpoint")
        if self.batch_invariant and (self.tensor_parallel_size > 1 or self.nnodes > 1):
            raise ValueError("batch_invariant needs one GPU: the all-reduce of tensor "
                             "parallelism sums in an order that depends on the message size")
        if self.batch_invariant and self.speculative_config is not None:
            raise ValueError("batch_invariant does not cover speculative decoding (its verify "
                             "steps take other kernels); drop one of the two")

    @classmethod
    def field_names(cls) -> set[str]:
        """Names accepted as keyword arguments."""
        return {f.name for f in fields(cls)}

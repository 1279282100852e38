"""The plugin API: everything a plugin may import from atlas-core, in one module.

A plugin (a model family, a backend, a hardware target, an op pack) imports from here and from
nowhere else in ``atlas_core``; its tests may also use :mod:`atlas_core.testing`. Whatever is
not listed in ``__all__`` is internal and may change without notice. ``tests/test_meta.py``
keeps the in-tree plugins and examples on it.

Names resolve lazily, so ``from atlas_core.api import hookimpl`` in a plugin's entry-point
module imports pluggy and nothing else: importing a plugin stays free.

Groups:

- Hooks: :data:`hookimpl`, the ``Register`` callable type, :func:`registers` and
  :func:`registers_ops` (hook implementations built from a plugin's tables), :class:`Registry`,
  :func:`make_plugin_manager`, :func:`resolve`, :class:`PluginError`.
- Contracts (ABCs of :mod:`atlas_core.interfaces`): :class:`GpuBackend`,
  :class:`ModelWeightLoader`, :class:`TransformerLayer`, :class:`CommBackend`,
  :class:`StorageBackend`, and what they exchange (:class:`StepMetadata`, :class:`KVCacheSpec`,
  :class:`LatentCacheSpec`, :class:`SlidingWindowCacheSpec`, :class:`RecurrentStateSpec`,
  :class:`DeviceInfo`, :class:`Graph`, :class:`EagerGraph`, :class:`HostRead`,
  :class:`DeviceEvent`, :class:`SpecVerifyRows`: the row layout of a graph-captured
  speculative verify step).
- Model building blocks: :class:`Module` with :class:`ParamSpec` / :class:`Source`,
  :class:`CausalLM`, :class:`DecoderOnlyLoader`, the built-in layers (:class:`DecoderLayer`,
  :class:`Attention`, :class:`GatedMLP`, :class:`SparseMoE`, :class:`MTPHead`), :func:`checkpoint_tensors`,
  :func:`model_dtype`, :func:`gated_activation`, :func:`rope_parameters`,
  :func:`rope_cos_sin_cache`, :func:`rope_inv_freq`, :func:`load_model`, :func:`read_config`.
- Ops and dtypes: :class:`OpSpec`, :class:`OpRegistry`, :class:`OpTable`, the NumPy
  references (``reference``, a module), the unfused compositions a backend falls back to
  (``compose_*``), the activations, quantized weights (:class:`QuantizedWeight`,
  :func:`quantize`, :func:`dequantize`, :func:`quant_layout`, :data:`QUANT_FORMATS`,
  :data:`E2M1_LUT`, :func:`unpack_e2m1`, :func:`fp8_codes`), the 4-bit KV cache rows
  (:func:`quantize_kv_nvfp4`, :func:`dequantize_kv_nvfp4`, :func:`nvfp4_row_bytes`, and
  :data:`NVFP4_PREFILL_SCRATCH`, the bytes the KV sizing keeps out of the pool for a backend's
  prefill over an nvfp4 history), :func:`pool_row_bytes` (bytes of
  one block row of a pool, for ``gather_blocks`` / ``scatter_blocks``), :func:`recurrent_verify`
  and :func:`recurrent_verify_graph` (a recurrent layer's speculative verify step, one state
  row a query position), :data:`bfloat16`,
  :data:`float8_e4m3fn`, :func:`as_dtype`, :func:`f32`.
- Running a model: :class:`LLM`, :class:`SamplingParams`, :class:`EngineArgs`,
  :class:`LLMEngine`, :class:`AsyncLLMEngine`, :class:`GuidedDecodingParams`,
  :class:`ServerConfig`, :func:`create_app`, :class:`Checkpoint`, :func:`write_safetensors`,
  :class:`Tokenizer` (tokenizer.json + chat template of a model directory), and ``env`` (the
  one module that reads ``ATLAS_*`` variables).
"""

from __future__ import annotations

import importlib
from typing import Any

#: Exported name -> ``"module:attr"`` (or ``"module"`` for a module exported whole).
_EXPORTS = {
    "hookimpl": "atlas_core.hookspecs:hookimpl",
    "Register": "atlas_core.hookspecs:Register",
    "registers": "atlas_core.hookspecs:registers",
    "registers_ops": "atlas_core.hookspecs:registers_ops",
    "PluginError": "atlas_core.plugins:PluginError",
    "Registry": "atlas_core.plugins:Registry",
    "make_plugin_manager": "atlas_core.plugins:make_plugin_manager",
    "resolve": "atlas_core.plugins:resolve",
    "CommBackend": "atlas_core.interfaces:CommBackend",
    "DeviceEvent": "atlas_core.interfaces:DeviceEvent",
    "DeviceInfo": "atlas_core.interfaces:DeviceInfo",
    "EagerGraph": "atlas_core.interfaces:EagerGraph",
    "GpuBackend": "atlas_core.interfaces:GpuBackend",
    "Graph": "atlas_core.interfaces:Graph",
    "HostRead": "atlas_core.interfaces:HostRead",
    "KVCacheSpec": "atlas_core.interfaces:KVCacheSpec",
    "LatentCacheSpec": "atlas_core.interfaces:LatentCacheSpec",
    "SlidingWindowCacheSpec": "atlas_core.interfaces:SlidingWindowCacheSpec",
    "ModelWeightLoader": "atlas_core.interfaces:ModelWeightLoader",
    "RecurrentStateSpec": "atlas_core.interfaces:RecurrentStateSpec",
    "StepMetadata": "atlas_core.interfaces:StepMetadata",
    "SpecVerifyRows": "atlas_core.interfaces.metadata:SpecVerifyRows",
    "recurrent_verify": "atlas_core.model.recurrent_verify:recurrent_verify",
    "recurrent_verify_graph": "atlas_core.model.recurrent_verify:recurrent_verify_graph",
    "pool_row_bytes": "atlas_core.ops.block_copy:pool_row_bytes",
    "StorageBackend": "atlas_core.interfaces:StorageBackend",
    "BlockDirectory": "atlas_core.storage.posix:BlockDirectory",
    "temp_name": "atlas_core.storage.posix:temp_name",
    "TransformerLayer": "atlas_core.interfaces:TransformerLayer",
    "Module": "atlas_core.model.params:Module",
    "ParamSpec": "atlas_core.model.params:ParamSpec",
    "Source": "atlas_core.model.params:Source",
    "CausalLM": "atlas_core.model.model:CausalLM",
    "DecoderOnlyLoader": "atlas_core.model.decoder_loader:DecoderOnlyLoader",
    "model_dtype": "atlas_core.model.decoder_loader:model_dtype",
    "DecoderLayer": "atlas_core.model.layers.decoder:DecoderLayer",
    "MTPHead": "atlas_core.model.layers.mtp:MTPHead",
    "Attention": "atlas_core.model.layers.attention:Attention",
    "GatedMLP": "atlas_core.model.layers.mlp:GatedMLP",
    "gated_activation": "atlas_core.model.layers.mlp:gated_activation",
    "SparseMoE": "atlas_core.model.layers.moe:SparseMoE",
    "checkpoint_tensors": "atlas_core.model.weight_loading:checkpoint_tensors",
    "WeightLoadError": "atlas_core.model.weight_loading:WeightLoadError",
    "ModelConfigError": "atlas_core.model.loader:ModelConfigError",
    "load_model": "atlas_core.model.loader:load_model",
    "read_config": "atlas_core.model.loader:read_config",
    "rope_parameters": "atlas_core.ops.rotary:rope_parameters",
    "rope_cos_sin_cache": "atlas_core.ops.rotary:rope_cos_sin_cache",
    "rope_inv_freq": "atlas_core.ops.rotary:rope_inv_freq",
    "reference": "atlas_core.ops.reference",
    "OpSpec": "atlas_core.ops.spec:OpSpec",
    "OpRegistry": "atlas_core.ops.registry:OpRegistry",
    "OpTable": "atlas_core.ops.registry:OpTable",
    "compose_moe_block": "atlas_core.ops.moe:compose_moe_block",
    "compose_rms_norm_linear": "atlas_core.ops.norm:compose_rms_norm_linear",
    "compose_rms_norm_moe_block": "atlas_core.ops.moe:compose_rms_norm_moe_block",
    "compose_rope_cache_attention": "atlas_core.ops.attention:compose_rope_cache_attention",
    "QuantizedWeight": "atlas_core.ops.quant:QuantizedWeight",
    "QUANT_FORMATS": "atlas_core.ops.quant:FORMATS",
    "E2M1_LUT": "atlas_core.ops.quant:E2M1_LUT",
    "quantize": "atlas_core.ops.quant:quantize",
    "dequantize": "atlas_core.ops.quant:dequantize",
    "quant_layout": "atlas_core.ops.quant:layout",
    "fp8_codes": "atlas_core.ops.quant:fp8_codes",
    "unpack_e2m1": "atlas_core.ops.quant:unpack_e2m1",
    "quantize_kv_nvfp4": "atlas_core.ops.kv_quant:quantize_kv_nvfp4",
    "dequantize_kv_nvfp4": "atlas_core.ops.kv_quant:dequantize_kv_nvfp4",
    "nvfp4_row_bytes": "atlas_core.ops.kv_quant:nvfp4_row_bytes",
    "NVFP4_PREFILL_SCRATCH": "atlas_core.engine.kv_layers:NVFP4_PREFILL_SCRATCH",
    "ACTIVATIONS": "atlas_core.ops.norm:ACTIVATIONS",
    "as_dtype": "atlas_core.ops._dtypes:as_dtype",
    "f32": "atlas_core.ops._dtypes:f32",
    "bfloat16": "atlas_core.ops._dtypes:bfloat16",
    "float8_e4m3fn": "atlas_core.ops._dtypes:float8_e4m3fn",
    "Checkpoint": "atlas_core.weights.checkpoint:Checkpoint",
    "write_safetensors": "atlas_core.weights.safetensors_file:write_safetensors",
    "env": "atlas_core.env",
    "LLM": "atlas_core.llm:LLM",
    "SamplingParams": "atlas_core.engine.sampling_params:SamplingParams",
    "EngineArgs": "atlas_core.engine.args:EngineArgs",
    "LLMEngine": "atlas_core.engine.llm_engine:LLMEngine",
    "AsyncLLMEngine": "atlas_core.engine.async_engine:AsyncLLMEngine",
    "GuidedDecodingParams": "atlas_core.guided.params:GuidedDecodingParams",
    "NumpyBackend": "atlas_core.backends.numpy_backend:NumpyBackend",
    "host_memory": "atlas_core.backends.numpy_backend:host_memory",
    "ServerConfig": "atlas_core.server:ServerConfig",
    "ServerThread": "atlas_core.server.launch:ServerThread",
    "Tokenizer": "atlas_core.tokenizer:Tokenizer",
    "create_app": "atlas_core.server:create_app",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"atlas_core.api has no {name!r}: plugins may use only the names in "
                             "atlas_core.api.__all__ (ask for an addition in an issue)")
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    value = getattr(module, attr) if attr else module
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

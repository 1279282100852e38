"""Baseline: a plain PyTorch Qwen3 (dense and MoE) with a static KV cache, decode under
``torch.compile(mode="reduce-overhead", fullgraph=True)``.

Test-time only, like :mod:`atlas_core.bench.baseline`: ``atlas bench --baseline compiled`` runs
``python -m atlas_core.bench.torch_baseline SPEC_JSON`` in its own process before Atlas loads;
nothing in ``atlas_core`` imports this module. Weights come from a checkpoint directory (the
same safetensors Atlas loads) or are drawn on the device with Atlas's random scales.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from atlas_core.bench.random_model import param_scale


def tensor_shapes(c: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF checkpoint names and shapes of a Qwen3 / Qwen3-MoE config."""
    h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or h // heads
    out = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,)}
    if not c.get("tie_word_embeddings"):
        out["lm_head.weight"] = (c["vocab_size"], h)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                    p + "self_attn.q_proj.weight": (heads * d, h),
                    p + "self_attn.k_proj.weight": (kv * d, h),
                    p + "self_attn.v_proj.weight": (kv * d, h),
                    p + "self_attn.o_proj.weight": (h, heads * d),
                    p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
        if c.get("num_experts"):
            e, inter = c["num_experts"], c["moe_intermediate_size"]
            out[p + "mlp.gate.weight"] = (e, h)
            for x in range(e):
                q = f"{p}mlp.experts.{x}."
                out.update({q + "gate_proj.weight": (inter, h), q + "up_proj.weight": (inter, h),
                            q + "down_proj.weight": (h, inter)})
        else:
            inter = c["intermediate_size"]
            out.update({p + "mlp.gate_proj.weight": (inter, h),
                        p + "mlp.up_proj.weight": (inter, h), p + "mlp.down_proj.weight": (h, inter)})
    return out


def load_weights(path: str | None, config: dict[str, Any], device: str, dtype: torch.dtype,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors (``path``), else random ones of :func:`tensor_shapes`."""
    if path is not None:
        from safetensors.torch import load_file
        out: dict[str, torch.Tensor] = {}
        for shard in sorted(Path(path).glob("*.safetensors")):
            out.update({k: v.to(device, dtype) for k, v in load_file(str(shard)).items()})
        return out
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in tensor_shapes(config).items():
        mean, std = param_scale(name, shape)
        out[name] = torch.empty(shape, dtype=dtype, device=device).normal_(mean, std, generator=gen)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class Layer(nn.Module):
    """One decoder layer; ``k_cache`` / ``v_cache``: ``[batch, kv_heads, max_len, head_dim]``."""

    def __init__(self, w: dict[str, torch.Tensor], p: str, c: dict[str, Any]) -> None:
        super().__init__()
        self.eps, self.heads = c["rms_norm_eps"], c["num_attention_heads"]
        self.kv_heads = c["num_key_value_heads"]
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        self.top_k, self.norm_topk = c.get("num_experts_per_tok", 0), c.get("norm_topk_prob")
        names = {"in_norm": "input_layernorm", "post_norm": "post_attention_layernorm",
                 **{n: f"self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj", "o_proj",
                                                  "q_norm", "k_norm")}}
        names.update({n: f"mlp.{n}" for n in ("gate", "gate_proj", "up_proj", "down_proj")})
        for short, name in names.items():
            if p + name + ".weight" in w:
                setattr(self, short, nn.Parameter(w[p + name + ".weight"], requires_grad=False))
        if c.get("num_experts"):
            ex = [f"{p}mlp.experts.{x}." for x in range(c["num_experts"])]
            gate_up = torch.stack([torch.cat((w[e + "gate_proj.weight"], w[e + "up_proj.weight"]))
                                   for e in ex])
            self.gate_up = nn.Parameter(gate_up, requires_grad=False)
            self.down = nn.Parameter(torch.stack([w[e + "down_proj.weight"] for e in ex]),
                                     requires_grad=False)

    def resize_cache(self, batch: int, max_len: int) -> None:
        shape = (batch, self.kv_heads, max_len, self.head_dim)
        like = self.q_proj
        self.register_buffer("k_cache", torch.zeros(shape, dtype=like.dtype, device=like.device))
        self.register_buffer("v_cache", torch.zeros(shape, dtype=like.dtype, device=like.device))

    def moe(self, h: torch.Tensor, decode: bool) -> torch.Tensor:
        # h: [tokens, hidden]. Decode: gather each token's experts while that reads fewer than
        # all of them, else run every expert on every token; prefill (eager): loop over experts.
        probs = torch.softmax(F.linear(h, self.gate).float(), -1)
        weight, idx = torch.topk(probs, self.top_k, -1)
        if self.norm_topk:
            weight = weight / weight.sum(-1, keepdim=True)
        weight = weight.to(h.dtype)
        num_experts = self.gate_up.shape[0]
        if decode and h.shape[0] * self.top_k < num_experts:
            g, u = torch.einsum("th,tkoh->tko", h, self.gate_up[idx]).chunk(2, -1)
            down = torch.einsum("tki,tkhi->tkh", F.silu(g) * u, self.down[idx])
            return (down * weight[..., None]).sum(1)
        if decode:
            route = torch.zeros(h.shape[0], num_experts, dtype=h.dtype, device=h.device)
            route.scatter_(1, idx, weight)
            g, u = torch.einsum("th,eoh->eto", h, self.gate_up).chunk(2, -1)
            return torch.einsum("eth,te->th", torch.einsum("eti,ehi->eth", F.silu(g) * u,
                                                           self.down), route)
        out = torch.zeros_like(h)
        for e in idx.unique().tolist():
            rows, slot = (idx == e).nonzero(as_tuple=True)
            g, u = F.linear(h[rows], self.gate_up[e]).chunk(2, -1)
            down = F.linear(F.silu(g) * u, self.down[e])
            out.index_add_(0, rows, down * weight[rows, slot, None])
        return out

    def forward(self, x: torch.Tensor, cos, sin, pos, mask) -> torch.Tensor:
        b, t, _ = x.shape
        h = rms_norm(x, self.in_norm, self.eps)
        q = rms_norm(F.linear(h, self.q_proj).view(b, t, -1, self.head_dim), self.q_norm, self.eps)
        k = rms_norm(F.linear(h, self.k_proj).view(b, t, -1, self.head_dim), self.k_norm, self.eps)
        v = F.linear(h, self.v_proj).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        if mask is None:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            attn = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask,
                                                  enable_gqa=True)
        x = x + F.linear(attn.transpose(1, 2).reshape(b, t, -1), self.o_proj)
        h = rms_norm(x, self.post_norm, self.eps)
        if self.top_k:
            return x + self.moe(h.view(b * t, -1), mask is not None).view(b, t, -1)
        return x + F.linear(F.silu(F.linear(h, self.gate_proj)) * F.linear(h, self.up_proj),
                            self.down_proj)


class Qwen3(nn.Module):
    """Qwen3 / Qwen3-MoE over a static cache; ``forward(ids [B, T], pos [T])`` returns the
    logits of the last position ``[B, vocab]`` (``T == 1``: a decode step over the cache)."""

    def __init__(self, w: dict[str, torch.Tensor], c: dict[str, Any]) -> None:
        super().__init__()
        self.eps = c["rms_norm_eps"]
        self.embed = nn.Parameter(w["model.embed_tokens.weight"], requires_grad=False)
        self.norm = nn.Parameter(w["model.norm.weight"], requires_grad=False)
        self.head = (nn.Parameter(w["lm_head.weight"], requires_grad=False)
                     if "lm_head.weight" in w else self.embed)
        self.layers = nn.ModuleList(Layer(w, f"model.layers.{i}.", c)
                                    for i in range(c["num_hidden_layers"]))
        d = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        theta = c.get("rope_theta", 10000.0)
        self.inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)

    def resize_cache(self, batch: int, max_len: int) -> None:
        """Static caches for ``batch`` sequences of up to ``max_len`` tokens (zeroed)."""
        dev, dtype = self.embed.device, self.embed.dtype
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float64), self.inv_freq)
        emb = torch.cat((freqs, freqs), -1)
        self.register_buffer("cos", emb.cos().to(dev, dtype))
        self.register_buffer("sin", emb.sin().to(dev, dtype))
        self.register_buffer("arange", torch.arange(max_len, device=dev))
        for layer in self.layers:
            layer.resize_cache(batch, max_len)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos[pos], self.sin[pos]
        mask = None if ids.shape[1] > 1 else (self.arange <= pos).view(1, 1, 1, -1)
        for layer in self.layers:
            x = layer(x, cos, sin, pos, mask)
        return F.linear(rms_norm(x[:, -1], self.norm, self.eps), self.head)


def bench_cell(model: Qwen3, step, batch: int, context: int, decode_tokens: int) -> dict:
    """Prefill ``batch`` random prompts of ``context`` tokens (eager), then time greedy decode
    steps at that context through ``step``."""
    dev = model.embed.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    warm = 3
    model.resize_cache(batch, context + warm + decode_tokens)
    ids = torch.randint(0, model.embed.shape[0], (batch, context), device=dev)
    sync()
    start = time.perf_counter()
    with torch.no_grad():
        tok = model(ids, torch.arange(context, device=dev)).argmax(-1, keepdim=True)
    sync()
    ttft = time.perf_counter() - start
    pos = torch.tensor([context], device=dev)
    for i in range(warm + decode_tokens):
        if i == warm:
            sync()
            start = time.perf_counter()
        tok = step(tok, pos).clone()
        pos = pos + 1
    sync()
    step_s = (time.perf_counter() - start) / decode_tokens
    return {"batch": batch, "context": context, "ttft_s": ttft,
            "prefill_tok_s": batch * context / ttft, "step_ms": 1e3 * step_s,
            "tok_s": batch / step_s}


def main(argv: list[str]) -> int:
    """``SPEC_JSON``: ``{"path" | "config", "batches", "contexts", "decode_tokens", "mode"
    ("compile" | "eager"), "device", "dtype"}``; prints one ``{"cell": ...}`` JSON line per
    finished cell, then the whole result as one JSON line."""
    spec = json.loads(argv[0])
    config = spec.get("config") or json.loads((Path(spec["path"]) / "config.json").read_text())
    device = spec.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, spec.get("dtype") or ("bfloat16" if device == "cuda" else "float32"))
    start = time.perf_counter()
    model = Qwen3(load_weights(spec.get("path"), config, device, dtype), config)
    load_s = time.perf_counter() - start
    compiled = spec.get("mode", "compile") == "compile"
    result: dict[str, Any] = {"library": f"PyTorch {torch.__version__} static cache, " + (
        "torch.compile(mode='reduce-overhead', fullgraph=True) decode" if compiled else "eager"),
        "decode_tokens": spec["decode_tokens"], "load_s": load_s, "cells": []}

    def greedy(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return model(ids, pos).argmax(-1, keepdim=True)

    for context in spec["contexts"]:
        for batch in spec["batches"]:
            torch._dynamo.reset()
            print(f"[compiled baseline] batch {batch} at context {context}", file=sys.stderr,
                  flush=True)
            step = (torch.compile(greedy, mode="reduce-overhead", fullgraph=True) if compiled
                    else greedy)
            try:
                with torch.no_grad():
                    cell = bench_cell(model, step, batch, context, spec["decode_tokens"])
            except Exception as exc:  # noqa: BLE001 - an out-of-memory cell is a result too
                cell = {"batch": batch, "context": context,
                        "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            result["cells"].append(cell)
            print(json.dumps({"cell": cell}), flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

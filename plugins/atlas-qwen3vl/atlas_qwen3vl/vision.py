"""The Qwen3-VL vision tower (also Qwen3.5 / Qwen3.6's): HF ``Qwen3VLVisionModel``.

patch embedding (a ``Conv3d`` whose stride is its kernel: a ``linear`` over flattened patches)
+ bilinearly resampled learned positions -> ``depth`` blocks (LayerNorm, bidirectional attention
with 2D rotary within each image, LayerNorm, GELU MLP) -> merger (LayerNorm, 2x2 patches
concatenated, MLP) to the language model's width. Blocks listed in ``deepstack_visual_indexes``
also feed a merger of their own whose outputs are added to the first decoder layers' hidden
states at the image tokens (DeepStack).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from atlas_core.api import Module

from atlas_qwen3vl.vision_layout import pos_embed_taps, rotary_cos_sin


@dataclass
class VisionOutput:
    """The tower's output for a batch of images, rows in image order.

    Attributes:
        embeds: ``[num_tokens, out_hidden]`` merged image embeddings.
        deepstack: one ``[num_tokens, out_hidden]`` per DeepStack layer.
    """

    embeds: Any
    deepstack: list[Any]


class _Merger(Module):
    def __init__(self, hidden: int, merge: int, out_hidden: int, postshuffle: bool) -> None:
        super().__init__()
        self.merged = hidden * merge * merge
        self.postshuffle = postshuffle
        norm = self.merged if postshuffle else hidden
        self.declare("norm.weight", (norm,))
        self.declare("norm.bias", (norm,))
        self.declare("linear_fc1.weight", (self.merged, self.merged))
        self.declare("linear_fc1.bias", (self.merged,))
        self.declare("linear_fc2.weight", (out_hidden, self.merged))
        self.declare("linear_fc2.bias", (out_hidden,))

    def forward(self, x: Any) -> Any:
        ops, p = self.ops, self.params
        if self.postshuffle:
            x = ops.layer_norm(x.reshape(-1, self.merged), p["norm.weight"], p["norm.bias"], 1e-6)
        else:
            x = ops.layer_norm(x, p["norm.weight"], p["norm.bias"], 1e-6).reshape(-1, self.merged)
        x = ops.gelu(ops.linear(x, p["linear_fc1.weight"], p["linear_fc1.bias"]), "none")
        return ops.linear(x, p["linear_fc2.weight"], p["linear_fc2.bias"])


class _Block(Module):
    def __init__(self, hidden: int, intermediate: int, num_heads: int, approximate: str) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden // num_heads
        self.approximate = approximate
        for name in ("norm1", "norm2"):
            self.declare(f"{name}.weight", (hidden,))
            self.declare(f"{name}.bias", (hidden,))
        self.declare("attn.qkv.weight", (3 * hidden, hidden))
        self.declare("attn.qkv.bias", (3 * hidden,))
        self.declare("attn.proj.weight", (hidden, hidden))
        self.declare("attn.proj.bias", (hidden,))
        self.declare("mlp.linear_fc1.weight", (intermediate, hidden))
        self.declare("mlp.linear_fc1.bias", (intermediate,))
        self.declare("mlp.linear_fc2.weight", (hidden, intermediate))
        self.declare("mlp.linear_fc2.bias", (hidden,))

    def forward(self, x: Any, cos_sin: Any, cu_seqlens: Any) -> Any:
        ops, p = self.ops, self.params
        h = ops.layer_norm(x, p["norm1.weight"], p["norm1.bias"], 1e-6)
        qkv = ops.linear(h, p["attn.qkv.weight"], p["attn.qkv.bias"])
        attn = ops.vision_attention(qkv, cos_sin, cu_seqlens, self.head_dim ** -0.5,
                                    num_heads=self.num_heads, head_dim=self.head_dim)
        x = ops.add(x, ops.linear(attn, p["attn.proj.weight"], p["attn.proj.bias"]))
        h = ops.layer_norm(x, p["norm2.weight"], p["norm2.bias"], 1e-6)
        h = ops.gelu(ops.linear(h, p["mlp.linear_fc1.weight"], p["mlp.linear_fc1.bias"]),
                     self.approximate)
        return ops.add(x, ops.linear(h, p["mlp.linear_fc2.weight"], p["mlp.linear_fc2.bias"]))


class VisionTower(Module):
    """HF ``Qwen3VLVisionModel`` over the registered ops; parameters mirror ``model.visual.*``.

    Args:
        config: the checkpoint's ``vision_config``.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        hidden, self.merge = int(config["hidden_size"]), int(config.get("spatial_merge_size", 2))
        self.patch_size = int(config.get("patch_size", 16))
        self.temporal = int(config.get("temporal_patch_size", 2))
        channels = int(config.get("in_channels", 3))
        self.num_heads = int(config["num_heads"])
        self.head_dim = hidden // self.num_heads
        self.num_grid = int(round(int(config["num_position_embeddings"]) ** 0.5))
        self.theta = float((config.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        self.deepstack_indexes = list(config.get("deepstack_visual_indexes") or [])
        self.out_hidden = int(config["out_hidden_size"])
        act = config.get("hidden_act", "gelu_pytorch_tanh")
        approximate = "tanh" if "tanh" in act else "none"
        self.patch_dim = channels * self.temporal * self.patch_size ** 2
        self.declare("patch_embed.proj.weight",
                     (hidden, channels, self.temporal, self.patch_size, self.patch_size))
        self.declare("patch_embed.proj.bias", (hidden,))
        self.declare("pos_embed.weight", (self.num_grid ** 2, hidden))
        self.blocks = [self.add(f"blocks.{i}", _Block(hidden, int(config["intermediate_size"]),
                                                       self.num_heads, approximate))
                       for i in range(int(config["depth"]))]
        self.merger = self.add("merger", _Merger(hidden, self.merge, self.out_hidden, False))
        self.deepstack_mergers = [
            self.add(f"deepstack_merger_list.{i}",
                     _Merger(hidden, self.merge, self.out_hidden, True))
            for i in range(len(self.deepstack_indexes))]

    def forward(self, pixel_values: Sequence[np.ndarray],
                grids: Sequence[Sequence[int]]) -> VisionOutput:
        """Encode a batch of images together.

        Args:
            pixel_values: per image, host float32 ``[patches, channels * temporal * patch**2]``.
            grids: per image, ``(grid_t, grid_h, grid_w)``.

        Returns:
            The :class:`VisionOutput` of all images, concatenated in order.
        """
        ops, p, backend = self.ops, self.params, self.backend
        pixels = backend.from_host(np.concatenate(pixel_values).astype(self.dtype))
        indices, weights = pos_embed_taps(grids, self.num_grid, self.merge)
        cu = np.concatenate([[0], np.cumsum([int(np.prod(g)) for g in grids])]).astype(np.int32)
        x = ops.linear(pixels, p["patch_embed.proj.weight"].reshape(-1, self.patch_dim),
                       p["patch_embed.proj.bias"])
        pos = ops.interpolate_pos_embed(p["pos_embed.weight"], backend.from_host(indices),
                                        backend.from_host(weights))
        x = ops.add(x, pos)
        cos_sin = backend.from_host(rotary_cos_sin(grids, self.head_dim, self.merge, self.theta))
        cu_seqlens = backend.from_host(cu)
        deepstack = []
        # the backend may reuse each block's op outputs once the next block has its input;
        # DeepStack features outlive that, so they are copied out of the workspace
        scope = backend.layer_scope(x.nbytes)
        for i, block in enumerate(self.blocks):
            x = block.forward(x, cos_sin, cu_seqlens)
            if i in self.deepstack_indexes:
                merger = self.deepstack_mergers[self.deepstack_indexes.index(i)]
                deepstack.append(self.persist(merger.forward(x)))
            if scope is not None:
                (x,) = scope.carry(x)
        return VisionOutput(self.merger.forward(x), deepstack)

    def persist(self, array: Any) -> Any:
        """A copy of ``array`` in device memory of its own (op outputs live in the step's
        workspace; encoded images outlive the step)."""
        kept = self.backend.empty(array.shape, array.dtype)
        self.backend.copy_(kept, array)
        return kept

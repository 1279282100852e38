"""``rope_vec.cu`` (policy ``rope=vec``: the q/k-norm + rotary + KV-write prologue with a head
in a warp's registers, head dims 256 / 512) against the reference op, through the same checks as
the backend contract's cache writes: every written slot, no other slot, q. Host-side choice:
test_rope_vec_host.py."""

import numpy as np
import pytest

from atlas_core.api import as_dtype, rope_cos_sin_cache
from atlas_core.testing.contracts_attention import AttentionContract
from atlas_core.testing.contracts_ops import BLOCK_SIZE, assert_close, make_rng, randn

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype,cache_dtype", [("bfloat16", "bfloat16"), ("float32", "float32"),
                                               ("bfloat16", "float8_e4m3fn")])
@pytest.mark.parametrize("heads,kv_heads,head_dim,rotary_dim,is_neox,norms,value", [
    (8, 4, 256, None, True, "act", None),        # Qwen3.5 / Gemma-4 sliding shapes
    (8, 2, 256, 64, False, None, None),          # partial, interleaved, no norms
    (8, 2, 512, 128, True, "f32", None),         # Gemma-4 full: a quarter rotated, f32 norms
    (8, 4, 256, None, True, "act", "norm"),      # Gemma-4 sliding: values normed
    (8, 2, 512, 128, True, "act", "k_eq_v")])    # Gemma-4 full: values from the key projection
def test_rope_vec_matches_the_reference(cuda_backend, use_policy, dtype, cache_dtype, heads,
                                        kv_heads, head_dim, rotary_dim, is_neox, norms, value):
    use_policy(rope="vec")
    rng = make_rng("rope_vec", dtype, cache_dtype, head_dim, rotary_dim, norms, value)
    num_tokens, num_blocks = 19, 3
    k_eq_v = value == "k_eq_v"
    width = (heads + (1 if k_eq_v else 2) * kv_heads) * head_dim
    cache = rope_cos_sin_cache(rotary_dim or head_dim, 512, {"rope_type": "default",
                                                             "rope_theta": 1e4})
    slots = rng.permutation(num_blocks * BLOCK_SIZE)[:num_tokens].astype(np.int32)
    slots[4] = -1
    norm_dtype = "float32" if norms == "f32" else dtype
    kwargs = dict(num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                  rotary_dim=rotary_dim, is_neox=is_neox, eps=1e-6,
                  q_norm=randn(rng, (head_dim,), norm_dtype, 0.3) + 1 if norms else None,
                  k_norm=randn(rng, (head_dim,), norm_dtype, 0.3) + 1 if norms else None)
    if value:
        kwargs.update(v_norm=np.ones(head_dim, dtype=as_dtype(norm_dtype)), k_eq_v=k_eq_v)
    args = (randn(rng, (num_tokens, width), dtype, 2.0),
            rng.integers(0, 512, num_tokens).astype(np.int32), cache)
    kv_scale = 0.5 if cache_dtype == "float8_e4m3fn" else 1.0
    got, want = AttentionContract()._check_cache_write(
        cuda_backend, "qk_norm_rope_and_cache", args, kwargs, slots, cache_dtype, num_blocks,
        (kv_heads, head_dim), kv_scale)
    assert_close(got, want, "qk_norm_rope_and_cache q (rope_vec)")


@pytest.mark.parametrize("head_dim,rotary_dim,is_neox", [(256, None, True), (512, 256, False)])
def test_rotary_embedding_takes_it_too(cuda_backend, use_policy, head_dim, rotary_dim, is_neox):
    from atlas_core.api import reference as ref
    use_policy(rope="vec")
    rng = make_rng("rope_vec_rotary", head_dim)
    cache = rope_cos_sin_cache(rotary_dim or head_dim, 600, {"rope_type": "default",
                                                             "rope_theta": 1e4})
    q, k = randn(rng, (11, 8, head_dim), "bfloat16"), randn(rng, (11, 2, head_dim), "bfloat16")
    positions = rng.integers(0, 600, 11).astype(np.int32)
    be = cuda_backend
    got = be.ops.rotary_embedding(be.from_host(q), be.from_host(k), be.from_host(positions),
                                  be.from_host(cache), rotary_dim, is_neox)
    want = ref.rotary_embedding(q, k, positions, cache, rotary_dim, is_neox)
    for g, w in zip(got, want):
        assert_close(be.to_host(g), w, "rotary_embedding (rope_vec)")

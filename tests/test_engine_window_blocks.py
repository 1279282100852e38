"""Sliding-window KV blocks (engine/window_blocks.py): sizing, freeing behind the window, prefix
hits and preemption, on a fake model whose window layer reads its context back through the
window table and checks it against the last ``window`` tokens of the full context."""

import numpy as np
import pytest

from atlas_core.engine import EngineArgs, SamplingParams
from atlas_core.engine.block_manager import block_hash
from atlas_core.engine.kv_sizing import plan_kv_cache
from atlas_core.engine.window_blocks import NO_BLOCK, WindowedBlockManager
from atlas_core.interfaces import DeviceInfo, KVCacheSpec, SlidingWindowCacheSpec
from atlas_core.ops._dtypes import bfloat16
from atlas_core.plugins import Registry
from atlas_core.testing.fake_model import FakeCausalLM, make_fake_engine, run_to_completion

WINDOW, BLOCK = 10, 4
GIB = 1 << 30


class WindowFake(FakeCausalLM):
    """A full layer (the fake's context-keyed logits) plus a sliding layer that stores the
    tokens in its own pool and records every row whose window read differs from the truth."""

    def __init__(self, backend, window=WINDOW):
        super().__init__(backend, vocab_size=64)
        self.window, self.mismatches, self.window_rows = window, [], 0

    def kv_cache_specs(self):
        return [KVCacheSpec(1, 1), SlidingWindowCacheSpec(1, 1, sliding_window=self.window)]

    def forward(self, input_ids, meta):
        out = super().forward(input_ids, meta)
        if meta.window_block_tables is None:
            return out
        pool = self.caches[1][0].reshape(-1)
        ids, slots = np.asarray(input_ids, np.int64), np.asarray(meta.window_slot_mapping)
        pool[slots[slots >= 0]] = ids[slots >= 0] + 1
        tables, cu = np.asarray(meta.window_block_tables), np.asarray(meta.cu_seqlens_q)
        bs = self.caches[1][0].shape[1]
        for b in range(len(cu) - 1):
            for row in range(int(cu[b]), int(cu[b + 1])):
                context = self.contexts[row]
                pos = np.arange(max(0, len(context) - self.window), len(context))
                got = (pool[tables[b][pos // bs] * bs + pos % bs] - 1).astype(np.int64).tolist()
                self.window_rows += 1
                if got != context[len(context) - len(pos):]:
                    self.mismatches.append((row, got, context))
        return out


def _engine(model, **kw):
    kw.setdefault("block_size", BLOCK)
    kw.setdefault("max_prefill_tokens", 16)
    return make_fake_engine(model, **kw)


def _numpy():
    return Registry().create("gpu_backends", "numpy")


def _generate(engine, prompts, max_tokens=12):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    final = run_to_completion(engine)
    return [final[f"r{i}"] for i in range(len(prompts))]


def _prompts(rng, lengths):
    return [rng.integers(0, 60, n).tolist() for n in lengths]


class Backend:
    def __init__(self, free=70 * GIB):
        self.free = free

    def memory_info(self):
        return self.free, 80 * GIB

    def device_info(self):
        return DeviceInfo("test", "cuda", 80 * GIB)


class Model:
    dtype, hidden_size, vocab_size, max_position_embeddings = bfloat16, 1024, 32000, 32768

    def __init__(self, specs):
        self.specs = specs

    def kv_cache_specs(self):
        return self.specs


def test_window_layers_get_their_own_pool_and_are_not_counted_per_block():
    full, sliding = KVCacheSpec(4, 512), SlidingWindowCacheSpec(16, 256, sliding_window=1024)
    args = EngineArgs(max_num_seqs=32, max_prefill_tokens=2048)
    kv = plan_kv_cache(Backend(), Model([sliding] * 5 + [full]), args)
    assert kv.bytes_per_block == 2 * 4 * 512 * 2 * 16
    pool = kv.window_pool
    assert pool.window == 1024 and pool.bytes_per_block == 5 * 2 * 16 * 256 * 2 * 16
    assert pool.num_blocks == 32 * (-(-1023 // 16) + 3) + -(-(2048 + 32) // 16)
    plain = plan_kv_cache(Backend(), Model([KVCacheSpec(16, 256)] * 5 + [full]), args)
    assert plain.window_pool is None and kv.num_blocks > 5 * plain.num_blocks
    assert plan_kv_cache(Backend(), Model([sliding] * 2), args).window_pool is None
    tiers = EngineArgs(max_num_seqs=32, kv_host_gb=1.0, kv_offload_dir="/unused")
    assert plan_kv_cache(Backend(), Model([sliding, full]), tiers).window_pool is not None


def test_short_memory_gives_each_pool_half():
    full, sliding = KVCacheSpec(4, 512), SlidingWindowCacheSpec(16, 256, sliding_window=1024)
    specs = [sliding] * 50 + [full] * 10
    kv = plan_kv_cache(Backend(free=20 * GIB), Model(specs), EngineArgs(max_num_seqs=64))
    window_bytes = kv.window_pool.num_blocks * kv.window_pool.bytes_per_block
    full_bytes = kv.num_blocks * kv.bytes_per_block
    assert kv.window_pool.num_blocks < 64 * 67
    assert window_bytes / (window_bytes + full_bytes) == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ValueError, match="sliding-window KV pool needs at least"):
        plan_kv_cache(Backend(free=int(9.5 * GIB)), Model(specs), EngineArgs(max_num_seqs=64))


def test_the_free_count_is_the_smaller_pool_s():
    from atlas_core.engine.sequence import Sequence

    bm = WindowedBlockManager(16, BLOCK, True, _pool(num_blocks=6))
    assert bm.num_free_blocks == 6
    seq = Sequence("a", 0, list(range(40)), SamplingParams(), 0)
    assert bm.can_allocate(seq, 24) and not bm.can_allocate(seq, 28)
    bm.allocate(seq, 24)
    assert bm.num_free_blocks == 0 and bm.num_used_blocks == 6


def test_blocks_behind_the_window_are_freed_and_every_read_is_the_window():
    model = WindowFake(_numpy())
    engine = _engine(model)
    assert isinstance(engine.block_manager, WindowedBlockManager)
    prompts = _prompts(np.random.default_rng(0), (37, 5, 22))
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    most = -(-(WINDOW - 1) // BLOCK) + 2
    while engine.has_unfinished_requests():
        engine.step()
        for seq in engine.scheduler.running:
            held = [b for b in seq.window_block_table if b != NO_BLOCK]
            assert len(held) <= most + -(-16 // BLOCK)
            if seq.num_computed_tokens > WINDOW + 2 * BLOCK:
                assert seq.window_block_table[0] == NO_BLOCK
    assert model.window_rows and not model.mismatches
    pool = engine.block_manager.window_pool
    assert pool.num_free_blocks == pool.num_blocks


def test_outputs_equal_the_engine_without_a_window_pool():
    prompts = _prompts(np.random.default_rng(1), (41, 3, 18, 26))
    windowed = _generate(_engine(WindowFake(_numpy())), prompts)
    plain = _generate(_engine(FakeCausalLM(_numpy())), prompts)
    assert [o.outputs[0].token_ids for o in windowed] == [o.outputs[0].token_ids for o in plain]


def test_a_prefix_hit_after_the_window_moved_on_reuses_the_cached_blocks():
    model = WindowFake(_numpy())
    engine = _engine(model)
    prompt = _prompts(np.random.default_rng(2), (45,))[0]
    first = _generate(engine, [prompt])[0]
    again = _generate(engine, [prompt + [7]])[0]
    assert again.num_cached_tokens == 44
    follow = _generate(_engine(FakeCausalLM(_numpy())), [prompt + [7]])[0]
    assert again.outputs[0].token_ids == follow.outputs[0].token_ids
    assert first.outputs[0].token_ids and not model.mismatches


def test_tiers_bring_back_the_window_blocks_a_prefix_resumes_from():
    model = WindowFake(_numpy())
    engine = _engine(model, num_kv_blocks=16, max_num_seqs=2, kv_host_gb=0.001)
    prompt, *others = _prompts(np.random.default_rng(4), (45, 50, 50))
    first = _generate(engine, [prompt])[0]
    for other in others:
        _generate(engine, [other])
    bm, parent = engine.block_manager, None
    for i in range(11):
        parent = block_hash(parent, prompt[i * BLOCK:(i + 1) * BLOCK])
        assert parent not in bm.block_of and parent not in bm.window_pool.block_of
    assert bm.window_pool.tiers is engine.kv_tiers.window
    again = _generate(engine, [prompt])[0]
    assert again.num_cached_tokens == 44
    assert engine.stats().kv_tiers["window_host"]["hits"] == 11 - bm.first_needed_block(44)
    assert again.outputs[0].token_ids == first.outputs[0].token_ids and not model.mismatches
    assert bm.num_used_blocks == 0 and bm.window_pool.num_used_blocks == 0


def test_the_window_pool_gets_its_own_disk_namespace():
    from atlas_core.engine.kv_disk import kv_namespace

    plain = kv_namespace(None, "m", "float32", BLOCK, [(BLOCK, 1, 8)] * 4)
    assert kv_namespace(None, "m", "float32", BLOCK, [(BLOCK, 1, 8)] * 4, None) == plain
    windowed = kv_namespace(None, "m", "float32", BLOCK, [(BLOCK, 1, 8)] * 4,
                            {"window": WINDOW, "window_layout": [[BLOCK, 1, 8]] * 2})
    assert windowed[0] != plain[0] and windowed[1]["window"] == WINDOW


def test_a_prefix_whose_window_blocks_were_evicted_is_shortened():
    bm = WindowedBlockManager(32, BLOCK, True, _pool(num_blocks=32))
    from atlas_core.engine.sequence import Sequence

    seq = Sequence("a", 0, list(range(30)), SamplingParams(), 0)
    bm.allocate(seq, 30)
    seq.num_computed_tokens = 30
    bm.commit(seq)
    assert seq.window_block_table[:5] == [NO_BLOCK] * 5
    bm.free(seq)
    pool = bm.window_pool
    evicted = pool.block_of[seq.block_hashes[6]]
    del pool.hash_of[evicted], pool.block_of[seq.block_hashes[6]]
    again = Sequence("b", 0, list(range(30)), SamplingParams(), 0)
    assert bm.match_prefix(again) == 6 * BLOCK
    assert len(again.block_table) == len(again.window_block_table) == 6
    table = again.window_block_table
    assert table[:3] == [NO_BLOCK] * 3 and NO_BLOCK not in table[3:]


def test_preemption_recomputes_through_the_window_pool():
    prompts = _prompts(np.random.default_rng(3), (30, 28, 33))
    model = WindowFake(_numpy())
    engine = _engine(model, num_kv_blocks=24)
    tight = _generate(engine, prompts, max_tokens=16)
    assert engine.scheduler.num_preemptions > 0 and not model.mismatches
    roomy = _generate(_engine(FakeCausalLM(_numpy())), prompts, max_tokens=16)
    assert [o.outputs[0].token_ids for o in tight] == [o.outputs[0].token_ids for o in roomy]


def _pool(num_blocks):
    from atlas_core.engine.window_blocks import WindowPool
    return WindowPool(WINDOW, num_blocks, 1)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_free_gives_every_window_block_back(prefix_caching):
    from atlas_core.engine.sequence import Sequence

    bm = WindowedBlockManager(16, BLOCK, prefix_caching, _pool(num_blocks=8))
    seq = Sequence("a", 0, list(range(50)), SamplingParams(), 0)
    for end in range(4, 51, 4):
        bm.allocate(seq, end)
        seq.num_computed_tokens = end
        bm.commit(seq)
    assert sum(b != NO_BLOCK for b in seq.window_block_table) <= 4
    bm.free(seq)
    assert bm.window_pool.num_free_blocks == 8 and bm.num_used_blocks == 0


def test_the_decode_floor_reads_each_sequence_s_window_of_the_sliding_layers():
    from atlas_core.engine.step_timing import StepBytes

    full, sliding = KVCacheSpec(4, 512), SlidingWindowCacheSpec(16, 256, sliding_window=1024)
    kv = plan_kv_cache(Backend(), Model([sliding] * 5 + [full]), EngineArgs(max_num_seqs=32))
    step = StepBytes(object(), kv)
    full_token, window_token = 2 * 4 * 512 * 2, 5 * 2 * 16 * 256 * 2
    assert step(2, 2 * 300) == 600 * full_token + 600 * window_token
    assert step(2, 2 * 5000) == 10000 * full_token + 2 * 1024 * window_token

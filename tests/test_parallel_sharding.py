"""What each rank holds (no processes): split sizes, GQA replication, vocabulary padding, the
checkpoint as a rank sees it, the parallel ops' references, and the parallel settings."""

import numpy as np
import pytest

from atlas_core.cli import build_parser
from atlas_core.cli._parallel_args import is_worker_node, parallel_kwargs
from atlas_core.engine import EngineArgs
from atlas_core.parallel.config import ParallelConfig, from_rank_env
from atlas_core.parallel.ops import embedding_shard, gather_vocab_shards, moe_remap_ids
from atlas_core.parallel.sharding import ShardedCheckpoint, ShardingError, ShardPlan

CONFIG = {"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16,
          "vocab_size": 101, "intermediate_size": 96, "num_experts": 8,
          "moe_intermediate_size": 32}


class _Checkpoint:
    def __init__(self, tensors):
        self.tensors = tensors

    def names(self):
        return list(self.tensors)

    def __contains__(self, name):
        return name in self.tensors

    def shape(self, name):
        return self.tensors[name].shape

    def get(self, name):
        return self.tensors[name]

    nbytes = 1000


def test_kv_heads_are_replicated_when_fewer_than_ranks():
    plans = [ShardPlan.from_config(CONFIG, r, 4) for r in range(4)]
    assert [p.kv_rows() for p in plans] == [slice(0, 16), slice(0, 16), slice(16, 32),
                                            slice(16, 32)]
    assert [p.q_rows() for p in plans][3] == slice(96, 128)
    local = plans[1].local_config(CONFIG)
    assert (local["num_attention_heads"], local["num_key_value_heads"], local["head_dim"],
            local["intermediate_size"], local["moe_intermediate_size"]) == (2, 1, 16, 24, 8)


def test_sizes_that_do_not_divide_are_refused_with_the_fix():
    with pytest.raises(ShardingError, match="num_attention_heads .8. is not divisible by "
                                            "--tensor-parallel-size 3"):
        ShardPlan.from_config(CONFIG, 0, 3)
    with pytest.raises(ShardingError, match="num_experts .8. is not divisible"):
        ShardPlan.from_config({**CONFIG, "num_attention_heads": 6, "num_key_value_heads": 6,
                               "intermediate_size": 96}, 0, 6, expert_parallel=True)
    with pytest.raises(ShardingError, match="quantized checkpoints"):
        ShardPlan.from_config({**CONFIG, "quantization_config": {"quant_method": "fp8"}}, 0, 2)


def test_sharded_checkpoint_slices_rows_columns_vocab_and_experts():
    rng = np.random.default_rng(0)
    tensors = {
        "model.layers.0.self_attn.q_proj.weight": rng.random((128, 64)),
        "model.layers.0.self_attn.o_proj.weight": rng.random((64, 128)),
        "model.layers.0.self_attn.o_proj.bias": np.ones(64),
        "model.layers.0.mlp.down_proj.weight": rng.random((64, 96)),
        "model.layers.0.mlp.experts.gate_up_proj": rng.random((8, 64, 64)),
        "model.embed_tokens.weight": rng.random((101, 64)),
        "model.norm.weight": np.ones(64),
    }
    full = _Checkpoint(tensors)
    r1 = ShardedCheckpoint(full, ShardPlan.from_config(CONFIG, 1, 2))
    q = r1.get("model.layers.0.self_attn.q_proj.weight")
    np.testing.assert_array_equal(q, tensors["model.layers.0.self_attn.q_proj.weight"][64:])
    assert r1.shape("model.layers.0.self_attn.o_proj.weight") == (64, 64)
    assert not r1.get("model.layers.0.self_attn.o_proj.bias").any()
    assert r1.shape("model.layers.0.mlp.down_proj.weight") == (64, 48)
    gate_up = tensors["model.layers.0.mlp.experts.gate_up_proj"]
    np.testing.assert_array_equal(r1.get("model.layers.0.mlp.experts.gate_up_proj"),
                                  np.concatenate([gate_up[:, 16:32], gate_up[:, 48:64]], axis=1))
    embed = r1.get("model.embed_tokens.weight")
    assert r1.shape("model.embed_tokens.weight") == embed.shape == (51, 64)
    np.testing.assert_array_equal(embed[:50], tensors["model.embed_tokens.weight"][51:])
    assert not embed[50].any()
    assert r1.get("model.norm.weight") is tensors["model.norm.weight"]
    ep = ShardedCheckpoint(full, ShardPlan.from_config(CONFIG, 1, 2, expert_parallel=True))
    np.testing.assert_array_equal(ep.get("model.layers.0.mlp.experts.gate_up_proj"), gate_up[4:])


def test_parallel_op_references():
    w = np.array([[0.5, 0.3, 0.2]], np.float32)
    ids = np.array([[5, 1, 6]], np.int32)
    weights, local = moe_remap_ids(w, ids, 4, 4)
    np.testing.assert_array_equal(local, [[1, 0, 2]])
    np.testing.assert_array_equal(weights, np.array([[0.5, 0.0, 0.2]], np.float32))
    table = np.arange(8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_array_equal(embedding_shard(np.array([3, 4, 7, 8], np.int32), table, 4),
                                  [[0, 0], [0, 1], [6, 7], [0, 0]])
    shards = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    np.testing.assert_array_equal(gather_vocab_shards(shards, 5), [[0, 1, 2, 6, 7], [3, 4, 5, 9, 10]])


def test_rank_environment_places_this_process():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1",
           "MASTER_PORT": "29500"}
    placed = from_rank_env(ParallelConfig(), env)
    assert (placed.world_size, placed.is_front, placed.local_ranks()) == (2, False, [(1, 1)])
    assert (placed.master_addr, placed.master_port) == ("10.0.0.1", 29501)
    assert from_rank_env(ParallelConfig(2), {}) == ParallelConfig(2)
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        from_rank_env(ParallelConfig(), {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"})
    with pytest.raises(ValueError, match="disagrees with WORLD_SIZE=2"):
        from_rank_env(ParallelConfig(4), env)


def test_nodes_and_flags():
    two = ParallelConfig(4, nnodes=2, node_rank=1, master_addr="h", master_port=29500)
    assert (two.is_front, two.local_ranks()) == (False, [(2, 0), (3, 1)])
    with pytest.raises(ValueError, match="multiple of nnodes"):
        ParallelConfig(3, nnodes=2, master_port=1)
    with pytest.raises(ValueError, match="needs --master-port"):
        ParallelConfig(2, nnodes=2)
    args = build_parser().parse_args(["serve", "m", "-tp", "4", "--enable-expert-parallel",
                                      "--nnodes", "2", "--node-rank", "1", "--master-addr", "h",
                                      "--master-port", "29500"])
    kwargs = parallel_kwargs(args)
    assert kwargs["tensor_parallel_size"] == 4 and kwargs["enable_expert_parallel"]
    assert is_worker_node(EngineArgs(model="m", **kwargs))
    with pytest.raises(ValueError, match="node_rank must be in 0..nnodes-1"):
        EngineArgs(model="m", tensor_parallel_size=2, node_rank=2)


def test_layers_the_transform_cannot_split_are_refused():
    from atlas_core.model.params import Module
    from atlas_core.parallel.transform import check_supported

    class Mamba2Mixer(Module):
        pass

    with pytest.raises(ShardingError, match="Mamba2Mixer layers cannot be split across GPUs"):
        check_supported(Mamba2Mixer())


def test_launcher_world_size_sets_the_tensor_parallel_size(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = build_parser().parse_args(["serve", "m"])
    assert parallel_kwargs(args)["tensor_parallel_size"] == 2


def test_step_description_carries_only_the_window_unless_history_is_read():
    import pickle

    from atlas_core.engine.sampler import LogitsRow
    from atlas_core.engine.sampling_params import SamplingParams
    from atlas_core.engine.scheduler import ScheduledSeq, SchedulerOutput
    from atlas_core.engine.sequence import Sequence
    from atlas_core.parallel.step import UnsupportedInParallel, describe_step

    seq = Sequence("r", 0, list(range(5000)), SamplingParams(), seed=1)
    seq.output_token_ids = [7, 8, 9]
    sched = SchedulerOutput(scheduled=[ScheduledSeq(seq, 5002, 1)])
    desc = pickle.loads(pickle.dumps(describe_step(sched, {seq.seq_id: [LogitsRow(seq)]})))
    light = desc.sched.scheduled[0].seq
    assert light.token_id_at(5002) == 9 and len(light) == 5003 and desc.sched.scheduled[0].samples
    assert len(light.output_token_ids) == 3 and desc.rows_of[seq.seq_id][0].seq is light
    assert len(pickle.dumps(desc)) < 4000
    other = Sequence("p", 0, list(range(50)), SamplingParams(repetition_penalty=1.2), seed=1)
    both = SchedulerOutput(scheduled=[ScheduledSeq(seq, 5002, 1), ScheduledSeq(other, 0, 50)])
    whole = describe_step(both, {})
    assert whole.sched.scheduled[0].seq.output_token_ids == [7, 8, 9]
    with pytest.raises(UnsupportedInParallel, match="guided decoding"):
        describe_step(sched, {seq.seq_id: [LogitsRow(seq, matcher=object())]})

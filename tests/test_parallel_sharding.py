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
from atlas_core.testing.checkpoints import write_tiny_checkpoint

CONFIG = {"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16,
          "vocab_size": 101, "intermediate_size": 96, "num_experts": 8,
          "moe_intermediate_size": 32}


def _rank_view(path, rank, world, expert_parallel=False):
    """Rank ``rank``'s plan, model (built from its local config) and checkpoint view."""
    from atlas_core.model.loader import architecture, create_loader, read_config
    from atlas_core.model.weight_loading import fp8_block_size
    from atlas_core.parallel.layer_rules import checkpoint_cuts, reshard_specs
    from atlas_core.plugins import Registry
    from atlas_core.weights.checkpoint import Checkpoint
    config = read_config(path)
    loader = create_loader(Registry(), architecture(config))
    resolved = loader.resolve_config(config)
    plan = ShardPlan.from_config(resolved, rank, world, expert_parallel)
    model = loader.build(plan.local_config(resolved))
    reshard_specs(model, plan)
    full = Checkpoint.open(path)
    return plan, model, full, ShardedCheckpoint(full, plan, checkpoint_cuts(model, plan),
                                                fp8_block_size(resolved))


def test_kv_heads_are_replicated_when_fewer_than_ranks():
    plans = [ShardPlan.from_config(CONFIG, r, 4) for r in range(4)]
    assert [p.kv_rows() for p in plans] == [slice(0, 16), slice(0, 16), slice(16, 32),
                                            slice(16, 32)]
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
    with pytest.raises(ShardingError, match=r"linear_num_key_heads \(2\) is not divisible by "
                                            "--tensor-parallel-size 4 .each GPU holds whole "
                                            "Gated DeltaNet key-head groups"):
        ShardPlan.from_config({**CONFIG, "linear_num_key_heads": 2,
                               "linear_num_value_heads": 8}, 0, 4)
    with pytest.raises(ShardingError, match="n_groups .1. is not divisible"):
        ShardPlan.from_config({**CONFIG, "mamba_num_heads": 8, "n_groups": 1}, 0, 2)


def test_sharded_checkpoint_slices_rows_columns_vocab_and_experts(tmp_path):
    path = write_tiny_checkpoint("Qwen3MoeForCausalLM", tmp_path, vocab_size=381)
    _, _, full, r1 = _rank_view(path, 1, 2)
    attn, moe = "model.layers.0.self_attn.", "model.layers.0.mlp."
    for name, rows in (("q_proj.weight", slice(32, 64)), ("k_proj.weight", slice(16, 32))):
        np.testing.assert_array_equal(r1.get(attn + name), full.get(attn + name)[rows])
    assert r1.shape(attn + "o_proj.weight") == (64, 32)
    assert r1.shape("model.layers.1.mlp.down_proj.weight") == (64, 64)
    np.testing.assert_array_equal(r1.get(moe + "experts.3.gate_proj.weight"),
                                  full.get(moe + "experts.3.gate_proj.weight")[16:])
    np.testing.assert_array_equal(r1.get(moe + "experts.3.down_proj.weight"),
                                  full.get(moe + "experts.3.down_proj.weight")[:, 16:])
    embed = r1.get("model.embed_tokens.weight")
    assert r1.shape("model.embed_tokens.weight") == embed.shape == (191, 64)
    np.testing.assert_array_equal(embed[:190], full.get("model.embed_tokens.weight")[191:])
    assert not embed[190].any()
    np.testing.assert_array_equal(r1.get("model.norm.weight"), full.get("model.norm.weight"))
    _, ep_model, _, ep = _rank_view(path, 1, 2, expert_parallel=True)
    np.testing.assert_array_equal(ep.get(moe + "experts.5.up_proj.weight"),
                                  full.get(moe + "experts.5.up_proj.weight"))
    sources = ep_model.children["model.layers.0"].children["mlp"].specs["experts.down_proj"]
    assert [s.name for s in sources.sources[0]] == [f"experts.{x}.down_proj.weight"
                                                    for x in range(4, 8)]


def test_fused_expert_tensors_are_cut_per_rank():
    from atlas_core.parallel.cuts import Cut
    gate_up = np.arange(8 * 64 * 4, dtype=np.float32).reshape(8, 64, 4)
    cut = Cut(1, blocks=(32, 32))
    np.testing.assert_array_equal(cut.take(gate_up, 1, 2),
                                  np.concatenate([gate_up[:, 16:32], gate_up[:, 48:64]], axis=1))
    assert cut.shape(gate_up.shape, 1, 2) == (8, 32, 4)
    assert Cut(0, spans=((4, 8),)).take(gate_up, 1, 2).shape == (4, 64, 4)
    bias = np.ones(4)
    assert Cut(zeros=True).take(bias, 0, 2) is bias and not Cut(zeros=True).take(bias, 1, 2).any()


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

    class RetNetMixer(Module):
        pass

    with pytest.raises(ShardingError, match="RetNetMixer layers cannot be split across GPUs"):
        check_supported(RetNetMixer())


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

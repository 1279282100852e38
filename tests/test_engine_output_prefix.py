"""Running requests' outputs are views of the append-only token lists, not per-step copies."""

import pytest

from atlas_core.engine.outputs import Prefix


def test_prefix_is_a_stable_view_of_the_first_n_items():
    items = [1, 2, 3]
    view = Prefix(items)
    items.extend([4, 5])
    assert len(view) == 3 and view == [1, 2, 3] and view == (1, 2, 3) and list(view) == [1, 2, 3]
    assert view[1:] == [2, 3] and view[-1] == 3 and view[::-1] == [3, 2, 1] and view[5:] == []
    assert view != [1, 2, 3, 4] and 4 not in view and repr(view) == "[1, 2, 3]"
    with pytest.raises(IndexError):
        view[3]
    assert Prefix(items) == [1, 2, 3, 4, 5] == Prefix(items, 5)


def test_engine_outputs_are_views_while_running_and_lists_when_finished(tmp_path):
    from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
    from atlas_core.testing.checkpoints import write_tiny_checkpoint
    path = write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path)
    engine = LLMEngine.from_args(EngineArgs(model=str(path), backend="numpy", max_num_seqs=2,
                                            num_kv_blocks=16, max_seq_len=64))
    engine.add_request("r", [1, 2, 3], SamplingParams(temperature=0, max_tokens=5,
                                                      ignore_eos=True, logprobs=1))
    seen = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            c = out.outputs[0]
            seen.append((type(c.token_ids), len(c.token_ids), list(c.new_token_ids)))
            if out.finished:
                final = c
    assert all(t is Prefix for t, _, _ in seen[:-1]) and seen[-1][0] is list
    assert [n for _, n, _ in seen] == [1, 2, 3, 4, 5]
    assert [i for _, _, new in seen for i in new] == final.token_ids
    assert isinstance(final.logprobs, list) and len(final.logprobs) == 5

"""The demo model's trained MTP head (``mtp.safetensors``, scripts/demo_model/train_mtp.py) on
the numpy backend: HF transformers still loads the base model alone, Atlas's drafts equal a
torch reference of the head, greedy replies are identical with and without MTP speculation,
and the head's acceptance stays above the floor measured when it was trained."""

from __future__ import annotations

import functools

import pytest

from test_demo_model import DEMO_DIR, TOOLS, safetensors_header

pytestmark = pytest.mark.timeout(180)

CONVERSATIONS = [
    ([{"role": "user", "content": "What is 482 + 39?"}], None),
    ([{"role": "user", "content": "What is the capital of Japan?"}], None),
    ([{"role": "user", "content": "What's the weather in Paris?"}], TOOLS),
    ([{"role": "user", "content": "Compute 17 minus 905"}], TOOLS),
    ([{"role": "user", "content": "What's the weather in Lisbon?"},
      {"role": "assistant", "content": "",
       "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                        "arguments": {"city": "Lisbon"}}}]},
      {"role": "tool", "content": '{"city": "Lisbon", "temperature": 21, "unit": "celsius", '
                                  '"condition": "cloudy"}'}], TOOLS),
]
#: Mean accepted length (tokens per drafted step, the bonus token included) of the shipped head
#: on CONVERSATIONS at K = 2: 2.61 (61 of 76 drafts) when it was trained; a retrained head or a
#: changed MTP path must stay above this.
MIN_MEAN_ACCEPTED_LENGTH_K2 = 2.4


def mtp(k: int) -> dict:
    return {"method": "mtp", "num_speculative_tokens": k, "draft_token_cost": 0.0}


def encode(tok) -> list[list[int]]:
    return [tok.encode(tok.apply_chat_template(m, tools=t, add_generation_prompt=True))
            for m, t in CONVERSATIONS]


def make_engine(spec=None, dtype=None):
    pytest.importorskip("atlas_qwen3", reason="the atlas-qwen3 plugin is not installed")
    from atlas_core.api import EngineArgs, LLMEngine
    return LLMEngine.from_args(EngineArgs(model=str(DEMO_DIR), backend="numpy", dtype=dtype,
                                          max_num_seqs=8, speculative_config=spec))


def generate(engine, prompts, max_tokens=48) -> list[list[int]]:
    from atlas_core.api import SamplingParams
    from atlas_core.testing.fake_model import run_to_completion
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    done = run_to_completion(engine)
    return [done[str(i)].outputs[0].token_ids for i in range(len(prompts))]


@pytest.fixture(scope="module")
def plain():
    engine = make_engine()
    return engine, generate(engine, encode(engine.tokenizer))


def test_head_is_shipped_in_bf16_next_to_the_weights():
    header = safetensors_header(DEMO_DIR / "mtp.safetensors")
    header.pop("__metadata__", None)
    assert all(name.startswith("mtp.") for name in header)
    assert header["mtp.fc.weight"]["shape"] == [256, 512]
    assert {t["dtype"] for t in header.values()} == {"BF16"}
    assert (DEMO_DIR / "mtp.safetensors").stat().st_size < 3 * 2**20


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_replies_are_identical_with_mtp(plain, k):
    engine, want = plain
    spec = make_engine(mtp(k))
    assert spec.model.mtp is not None and not engine.model.mtp_enabled
    assert generate(spec, encode(spec.tokenizer)) == want
    stats = spec.stats().speculative
    assert stats.num_accepted_tokens > 0
    assert spec.block_manager.num_used_blocks == 0


def test_acceptance_stays_above_the_measured_floor():
    spec = make_engine(mtp(2))
    generate(spec, encode(spec.tokenizer))
    st = spec.stats().speculative
    mean = (st.num_accepted_tokens + st.num_drafts) / st.num_drafts
    assert mean > MIN_MEAN_ACCEPTED_LENGTH_K2, (st, mean)


@functools.lru_cache(maxsize=1)
def reference_parts():
    """HF's base model and a Qwen3 decoder block holding the head's weights (torch, fp32)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        DEMO_DIR, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    block = type(hf.model.layers[0])(hf.config, 0).eval()
    prefix = "mtp.layers.0."
    tensors = {k: v.float() for k, v in load_file(str(DEMO_DIR / "mtp.safetensors")).items()}
    block.load_state_dict({k[len(prefix):]: v for k, v in tensors.items()
                           if k.startswith(prefix)})
    return hf.eval(), info, block, tensors


def reference_drafts(prompt: list[int], next_token: int, num_drafts: int) -> list[int]:
    """The head's chained argmax drafts in torch, as the proposer computes them."""
    import torch
    hf, _, block, w = reference_parts()
    eps = hf.config.rms_norm_eps

    def norm(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    with torch.no_grad():
        hidden = hf.model(torch.tensor([prompt])).last_hidden_state[0]
        ids, hs, drafts = list(prompt[1:]) + [next_token], list(hidden), []
        for _ in range(num_drafts):
            t = len(ids)
            e = norm(hf.model.embed_tokens(torch.tensor(ids)),
                     w["mtp.pre_fc_norm_embedding.weight"])
            h = norm(torch.stack(hs), w["mtp.pre_fc_norm_hidden.weight"])
            x = (torch.cat([e, h], -1) @ w["mtp.fc.weight"].T)[None]
            pos = torch.arange(t)[None]
            mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
            out = block(x, attention_mask=mask, position_ids=pos,
                        position_embeddings=hf.model.rotary_emb(x, pos))
            out = norm((out[0] if isinstance(out, tuple) else out)[0, -1], w["mtp.norm.weight"])
            drafts.append(int(torch.argmax(hf.lm_head(out))))
            ids.append(drafts[-1])
            hs.append(out)
    return drafts


def test_hf_loads_the_base_model_alone():
    _, info, _, _ = reference_parts()
    assert not info["missing_keys"] and not info["unexpected_keys"]


def test_drafts_equal_the_torch_reference():
    from atlas_core.api import SamplingParams
    reference_parts()
    engine = make_engine(mtp(2), dtype="float32")
    for i, prompt in enumerate(encode(engine.tokenizer)[:3]):
        engine.add_request(f"p{i}", prompt, SamplingParams(temperature=0, max_tokens=2))
        seq = engine.groups[f"p{i}"].seqs[0]
        while not seq.output_token_ids:
            engine.step()
        got = engine.speculator.proposer.propose(seq, 2)
        assert got == reference_drafts(prompt, seq.output_token_ids[0], 2)
        generate(engine, [])

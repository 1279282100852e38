"""The MTP head of tiny Qwen3.5 / Qwen3-Next checkpoints (random ``mtp.*`` weights): loaded
next to the model, its drafts equal a torch reference built from HF transformers' decoder
layer (HF itself does not load MTP weights), and greedy output with MTP speculation is the
output without it."""

from __future__ import annotations

import functools
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from atlas_core.api import EngineArgs, LLMEngine, SamplingParams
from atlas_core.testing.fake_model import run_to_completion
from atlas_core.testing.mtp_heads import add_mtp_head

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(180)

ARCHS = ("Qwen3_5ForCausalLM", "Qwen3NextForCausalLM")
MTP = {"method": "mtp", "num_speculative_tokens": 2, "draft_token_cost": 0.0}


@pytest.fixture(scope="module")
def mtp_checkpoints(checkpoints, registry, tmp_path_factory):
    out = {}
    for arch in ARCHS:
        path = tmp_path_factory.mktemp("mtp") / arch
        shutil.copytree(checkpoints[arch], path)
        tensors = add_mtp_head(path, arch, registry.get("weight_loaders", arch)())
        out[arch] = (path, tensors)
    return out


def make_engine(path, spec=None):
    return LLMEngine.from_args(EngineArgs(model=str(path), backend="numpy", num_kv_blocks=64,
                                          max_num_seqs=4, block_size=8, speculative_config=spec))


@functools.lru_cache(maxsize=2)
def reference_parts(path: str):
    """HF's model and a full-attention decoder block holding the mtp weights (torch)."""
    tensors = load_file(f"{path}/mtp.safetensors")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    cfg = hf.config
    cfg_full = cfg.__class__(**{**cfg.to_dict(), "layer_types": ["full_attention"] * len(
        cfg.layer_types)})
    cfg_full._attn_implementation = "eager"
    block = type(hf.model.layers[-1])(cfg_full, 0).eval()
    prefix = "mtp.layers.0."
    block.load_state_dict(fuse_experts({k[len(prefix):]: torch.from_numpy(v)
                                        for k, v in tensors.items() if k.startswith(prefix)}))
    w = {k: torch.from_numpy(v) for k, v in tensors.items() if not k.startswith(prefix)}
    return hf, block, w


def reference_drafts(path, prompt, next_token, num_drafts):
    """Drafts of the head in torch: embed/norm/fc, HF's block, final norm, lm_head."""
    hf, block, w = reference_parts(str(path))
    cfg = hf.config

    def norm(x, g):
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * (1.0 + g)

    with torch.no_grad():
        hidden = hf.model(torch.tensor([prompt])).last_hidden_state[0]
        ids, hs, drafts = list(prompt[1:]) + [next_token], list(hidden), []
        for step in range(num_drafts):
            t = len(ids)
            e = hf.model.embed_tokens(torch.tensor(ids))
            x = torch.cat([norm(e, w["mtp.pre_fc_norm_embedding.weight"]),
                           norm(torch.stack(hs), w["mtp.pre_fc_norm_hidden.weight"])], -1)
            x = (x @ w["mtp.fc.weight"].T)[None]
            pos = torch.arange(t)[None]
            rope_pos = pos[None].expand(3, 1, -1) if "qwen3_5" in cfg.model_type else pos
            cos_sin = hf.model.rotary_emb(x, rope_pos)
            mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
            out = block(x, position_embeddings=cos_sin, attention_mask=mask, position_ids=pos)
            out = out[0] if isinstance(out, tuple) else out
            h = norm(out[0, -1], w["mtp.norm.weight"])
            drafts.append(int(torch.argmax(hf.lm_head(h))))
            ids.append(drafts[-1])
            hs.append(h)
    return drafts


def fuse_experts(state: dict) -> dict:
    """Per-expert ``mlp.experts.{e}.*`` tensors in HF's fused ``gate_up_proj`` / ``down_proj``."""
    num = len({k.split(".")[2] for k in state if k.startswith("mlp.experts.")})
    if not num:
        return state
    out = {k: v for k, v in state.items() if not k.startswith("mlp.experts.")}
    e = "mlp.experts."
    out[e + "gate_up_proj"] = torch.stack([torch.cat([state[f"{e}{i}.gate_proj.weight"],
                                                      state[f"{e}{i}.up_proj.weight"]])
                                           for i in range(num)])
    out[e + "down_proj"] = torch.stack([state[f"{e}{i}.down_proj.weight"] for i in range(num)])
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_drafts_equal_the_torch_reference(arch, mtp_checkpoints):
    path, tensors = mtp_checkpoints[arch]
    engine = make_engine(path, MTP)
    assert engine.model.mtp is not None and len(engine.runner.kv_caches) == 5
    rng = np.random.default_rng(21)
    for i, n in enumerate((7, 12)):
        prompt = rng.integers(0, 370, n).tolist()
        engine.add_request(f"p{i}", prompt, SamplingParams(temperature=0, max_tokens=2,
                                                           ignore_eos=True))
        seq = engine.groups[f"p{i}"].seqs[0]
        while not seq.output_token_ids:
            engine.step()
        got = engine.speculator.proposer.propose(seq, 2)
        assert got == reference_drafts(path, prompt, seq.output_token_ids[0], 2)
        run_to_completion(engine)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_with_mtp_is_unchanged(arch, mtp_checkpoints):
    path, _ = mtp_checkpoints[arch]
    rng = np.random.default_rng(22)
    prompts = [rng.integers(0, 370, n).tolist() for n in (13, 4, 21)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    outs = []
    for spec in (None, MTP):
        engine = make_engine(path, spec)
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, params)
        done = run_to_completion(engine)
        outs.append([done[f"r{i}"].outputs[0].token_ids for i in range(3)])
    assert outs[0] == outs[1]
    assert engine.stats().speculative.num_draft_tokens > 0
    assert engine.block_manager.num_used_blocks == 0


def test_plain_serving_ignores_the_head_kv(mtp_checkpoints):
    engine = make_engine(mtp_checkpoints["Qwen3_5ForCausalLM"][0])
    assert engine.model.mtp is not None and not engine.model.mtp_enabled
    assert len(engine.runner.kv_caches) == 4


@pytest.mark.gpu
def test_cuda_greedy_with_mtp_is_unchanged(mtp_checkpoints, cuda_backend):
    path, _ = mtp_checkpoints["Qwen3_5ForCausalLM"]
    rng = np.random.default_rng(23)
    prompts = [rng.integers(0, 370, n).tolist() for n in (13, 4, 21)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    outs = []
    for spec in (None, MTP):
        args = EngineArgs(model=str(path), num_kv_blocks=64, max_num_seqs=4, block_size=8,
                          speculative_config=spec)
        engine = LLMEngine.from_args(args, backend=cuda_backend)
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, params)
        done = run_to_completion(engine)
        outs.append([done[f"r{i}"].outputs[0].token_ids for i in range(3)])
    assert outs[0] == outs[1]
    assert engine.stats().speculative.num_draft_tokens > 0

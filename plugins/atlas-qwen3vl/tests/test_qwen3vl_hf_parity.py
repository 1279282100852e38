"""Qwen3-VL (dense, MoE) and the Qwen3.5 VL checkpoints against HF transformers on tiny random
checkpoints it saved, with images.

Tolerances (float32 checkpoints; features and logits are O(1)):
- vision features (merged embeddings and every DeepStack output): max |atlas - HF| < 1e-4.
- language logits over every position of a prompt with images: max |diff| < 1e-4 for Qwen3-VL;
  for the Qwen3.5 hybrids max |diff| <= 5e-5 * max |HF logit| (their Gated DeltaNet scan rounds
  apart from HF's reference by ~1e-5 relative on text alone, ~3e-5 after the image rows).
- bfloat16 (Qwen3-VL dense): vision features max |diff| < 0.05 * max |HF|, logits max |diff|
  < 0.15 (as the dense text families).
- greedy: the tokens of ``model.generate`` (up to 12) identical through the engine for a
  one-image and a two-image request batched with a text-only one (images of a step encoded
  together, prefill chunks that cut through images).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from atlas_core.api import EngineArgs, LLMEngine, SamplingParams, load_model  # noqa: E402
from atlas_core.testing.forward import ForwardRunner  # noqa: E402
from atlas_qwen3vl.image_processor import ImageProcessor  # noqa: E402
from atlas_qwen3vl.multimodal import MultiModalInput  # noqa: E402
from qwen3vl_checkpoints import png_bytes, save_hf_checkpoint  # noqa: E402

pytestmark = pytest.mark.reference

ARCHS = ["Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
         "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"]
ATOL = 1e-4
IMAGE, START, END = 383, 381, 382


@pytest.fixture(scope="module")
def pair(tmp_path_factory, registry):
    cache = {}

    def get(arch):
        if arch not in cache:
            path = save_hf_checkpoint(arch, tmp_path_factory.mktemp(arch), registry)
            hf = getattr(transformers, arch).from_pretrained(path, dtype=torch.float32).eval()
            cache[arch] = (path, load_model(path, "numpy", registry=registry), hf)
        return cache[arch]
    return get


PROCESSOR = ImageProcessor({"patch_size": 8, "merge_size": 2, "min_pixels": 1024,
                            "max_pixels": 4096})


def _image(height, width, seed):
    return PROCESSOR.preprocess(PROCESSOR.decode(png_bytes(height, width, seed)))


def _prompt(images, text=(10, 20, 30)):
    ids = list(text)
    for img in images:
        ids += [START] + [IMAGE] * img.num_tokens(2) + [END] + [40, 50]
    return ids + [60, 70, 80]


def _hf_inputs(ids, images):
    t = torch.tensor([ids])
    return dict(input_ids=t, mm_token_type_ids=(t == IMAGE).int(),
                pixel_values=torch.tensor(np.concatenate([i.pixel_values for i in images])),
                image_grid_thw=torch.tensor([i.grid_thw for i in images]))


@pytest.mark.parametrize("arch", ARCHS)
def test_vision_features_match_hf(pair, arch):
    _, model, hf = pair(arch)
    images = [_image(40, 56, 0), _image(30, 30, 1)]
    outs = model.encode_images([i.pixel_values for i in images], [i.grid_thw for i in images])
    with torch.no_grad():
        ref = hf.model.get_image_features(
            torch.tensor(np.concatenate([i.pixel_values for i in images])),
            torch.tensor([i.grid_thw for i in images]), return_dict=True)
    for k, out in enumerate(outs):
        assert np.abs(out.embeds - ref.pooler_output[k].numpy()).max() < ATOL
        deepstack = getattr(ref, "deepstack_features", None) or []
        assert len(out.deepstack) == len(deepstack) == (2 if "VL" in arch else 0)
        for mine, theirs in zip(out.deepstack, deepstack):
            assert np.abs(mine - theirs[k].numpy()).max() < ATOL


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_with_images_match_hf(pair, arch):
    _, model, hf = pair(arch)
    images = [_image(40, 56, 2), _image(24, 40, 3)]
    ids = _prompt(images)
    mm = MultiModalInput.build(ids, IMAGE, images, 2)
    runner = ForwardRunner(model, model.backend, max_seq_len=len(ids) + 16)
    meta = runner.metadata([0], [len(ids)], all_logits=True)
    meta.host["positions"][:] = mm.positions(0, len(ids))
    meta.positions = model.backend.from_host(meta.host["positions"])
    meta.multimodal = [(0, 0, len(ids), mm)]
    hidden = model.forward(np.asarray(ids, np.int32), meta)
    logits = model.compute_logits(hidden, meta.logits_indices)
    with torch.no_grad():
        ref = hf(**_hf_inputs(ids, images)).logits[0].numpy()
    bound = ATOL if "VL" in arch else 5e-5 * max(1.0, float(np.abs(ref).max()))
    assert np.abs(logits - ref).max() < bound


def test_bfloat16_close_to_hf(pair, registry):
    path, _, _ = pair(ARCHS[0])
    model = load_model(path, "numpy", dtype="bfloat16", registry=registry)
    hf = transformers.Qwen3VLForConditionalGeneration.from_pretrained(
        path, dtype=torch.bfloat16).eval()
    images = [_image(40, 56, 7)]
    out = model.encode_images([i.pixel_values for i in images], [i.grid_thw for i in images])[0]
    ids = _prompt(images)
    mm = MultiModalInput.build(ids, IMAGE, images, 2)
    runner = ForwardRunner(model, model.backend, max_seq_len=len(ids) + 16)
    meta = runner.metadata([0], [len(ids)], all_logits=True)
    meta.host["positions"][:] = mm.positions(0, len(ids))
    meta.positions = model.backend.from_host(meta.host["positions"])
    meta.multimodal = [(0, 0, len(ids), mm)]
    logits = model.compute_logits(model.forward(np.asarray(ids, np.int32), meta),
                                  meta.logits_indices)
    with torch.no_grad():
        feats = hf.model.get_image_features(
            torch.tensor(images[0].pixel_values), torch.tensor([images[0].grid_thw]),
            return_dict=True).pooler_output[0].float().numpy()
        ref = hf(**_hf_inputs(ids, images)).logits[0].float().numpy()
    embeds = np.asarray(out.embeds, np.float32)
    assert np.abs(embeds - feats).max() < 0.05 * np.abs(feats).max()
    assert np.abs(logits - ref).max() < 0.15


def _run(engine, requests):
    for rid, ids, mm in requests:
        engine.add_request(rid, ids, SamplingParams(max_tokens=12, temperature=0,
                                                    ignore_eos=True), mm_inputs=mm)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


@pytest.mark.parametrize("arch", [ARCHS[0], ARCHS[2]] + [
    pytest.param(a, marks=pytest.mark.slow) for a in (ARCHS[1], ARCHS[3])])
def test_greedy_through_engine_matches_hf(pair, arch):
    path, _, hf = pair(arch)
    engine = LLMEngine.from_args(EngineArgs(model=str(path), backend="numpy", max_num_seqs=4,
                                            num_kv_blocks=64, block_size=16,
                                            max_prefill_tokens=20))
    images, pair_of_images = [_image(40, 56, 4)], [_image(24, 40, 5), _image(40, 24, 6)]
    ids, ids2 = _prompt(images), _prompt(pair_of_images, text=(11, 12))
    text_ids = list(range(5, 40))
    done = _run(engine, [("img", ids, MultiModalInput.build(ids, IMAGE, images, 2)),
                         ("img2", ids2, MultiModalInput.build(ids2, IMAGE, pair_of_images, 2)),
                         ("text", text_ids, None)])
    with torch.no_grad():
        ref = hf.generate(**_hf_inputs(ids, images), max_new_tokens=12, do_sample=False)
        ref2 = hf.generate(**_hf_inputs(ids2, pair_of_images), max_new_tokens=12,
                           do_sample=False)
        ref_text = hf.generate(input_ids=torch.tensor([text_ids]), max_new_tokens=12,
                               do_sample=False)
    # HF stops after an end-of-turn token; the engine ignores EOS and goes on
    for rid, prompt, hf_ids in (("img", ids, ref), ("img2", ids2, ref2),
                                ("text", text_ids, ref_text)):
        expected = hf_ids[0, len(prompt):].tolist()
        assert len(expected) >= 6
        assert done[rid].outputs[0].token_ids[:len(expected)] == expected

def test_prefix_cache_is_keyed_by_image_content(pair):
    path, _, _ = pair(ARCHS[0])
    engine = LLMEngine.from_args(EngineArgs(model=str(path), backend="numpy", max_num_seqs=2,
                                            num_kv_blocks=64, block_size=4))
    same, other = _image(40, 56, 5), _image(40, 56, 6)
    ids = _prompt([same])
    first = _run(engine, [("a", ids, MultiModalInput.build(ids, IMAGE, [same], 2))])["a"]
    again = _run(engine, [("b", ids, MultiModalInput.build(ids, IMAGE, [same], 2))])["b"]
    changed = _run(engine, [("c", ids, MultiModalInput.build(ids, IMAGE, [other], 2))])["c"]
    assert again.num_cached_tokens >= len(ids) - 4
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    # the text before the image is shared; nothing from the first placeholder on
    assert changed.num_cached_tokens <= ids.index(IMAGE)
    assert changed.outputs[0].token_ids != first.outputs[0].token_ids

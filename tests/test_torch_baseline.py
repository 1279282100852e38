"""The compiled-PyTorch baseline of ``atlas bench``: its Qwen3 matches Atlas's numpy backend on
the same random checkpoint, and ``--baseline compiled`` runs it in its own process."""

import json

import numpy as np
import pytest

from atlas_core.bench.checkpoint import write_random_checkpoint
from atlas_core.bench.shapes import shape_config
from atlas_core.cli import main
from atlas_core.model import load_model
from atlas_core.testing.forward import ForwardRunner

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.reference


@pytest.fixture(scope="module", params=["tiny", "tiny-moe"])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return write_random_checkpoint(shape_config(request.param), path, dtype="float32", seed=5)


def test_logits_match_atlas_numpy(checkpoint):
    from atlas_core.bench.torch_baseline import Qwen3, load_weights
    config = json.loads((checkpoint / "config.json").read_text())
    model = load_model(str(checkpoint), "numpy", dtype="float32")
    runner = ForwardRunner(model, model.backend, max_seqs=2, max_seq_len=32)
    prompts = [[3, 17, 250, 9, 41, 7], [11, 5, 300, 2, 8, 99]]
    ours = [np.concatenate(runner.step(prompts))]
    ref = Qwen3(load_weights(str(checkpoint), config, "cpu", torch.float32), config)
    ref.resize_cache(2, 32)
    with torch.no_grad():
        theirs = [ref(torch.tensor(prompts), torch.arange(6))]
        nxt = [int(t) for t in theirs[0].argmax(-1)]
        ours.append(np.concatenate(runner.step([[t] for t in nxt])))
        theirs.append(ref(torch.tensor([[t] for t in nxt]), torch.tensor([6])))
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b.numpy(), rtol=2e-4, atol=2e-4)


def test_bench_with_eager_baseline_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path))
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", "tiny", "--backend", "numpy", "--batch", "1,2",
                 "--context", "24", "--decode-tokens", "6", "--copy-mb", "1", "--baseline",
                 "compiled", "--baseline-mode", "eager", "--json", str(out)]) == 0
    base = json.loads(out.read_text())["baselines"]["compiled"]
    assert "error" not in base, base
    assert "eager" in base["library"]
    cells = {(c["batch"], c["context"]): c for c in base["cells"]}
    assert set(cells) == {(1, 24), (2, 24)}
    assert all(c["tok_s"] > 0 and c["ttft_s"] > 0 for c in cells.values())


def test_moe_paths_agree(checkpoint):
    # Decode gathers experts (few tokens) or runs all of them (many); prefill loops over them.
    from atlas_core.bench.torch_baseline import Qwen3, load_weights
    config = json.loads((checkpoint / "config.json").read_text())
    if not config.get("num_experts"):
        pytest.skip("dense shape")
    layer = Qwen3(load_weights(str(checkpoint), config, "cpu", torch.float32), config).layers[0]
    h = torch.randn(6, config["hidden_size"], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gathered = torch.cat([layer.moe(h[i:i + 2], True) for i in range(0, 6, 2)])
        dense, looped = layer.moe(h, True), layer.moe(h, False)
    torch.testing.assert_close(gathered, looped, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dense, looped, rtol=1e-5, atol=1e-5)

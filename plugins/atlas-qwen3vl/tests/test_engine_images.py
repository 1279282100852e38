"""Image requests through the engine on the mock backend, which replays decode steps as
captured graphs with async scheduling (the path the cuda backend takes, decode positions
shifted by the image's rope delta): the same features and greedy tokens as the numpy backend."""

import numpy as np
import pytest

pytest.importorskip("torch")

from qwen3vl_checkpoints import (greedy_with_image, save_hf_checkpoint,  # noqa: E402
                                 small_processor_config)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, registry):
    path = save_hf_checkpoint("Qwen3VLForConditionalGeneration", tmp_path_factory.mktemp("vl"),
                              registry, seed=3)
    small_processor_config(path)
    return path


def test_mock_backend_graphs_match_numpy(checkpoint):
    ref_embeds, ref = greedy_with_image(checkpoint, "numpy")
    embeds, got = greedy_with_image(checkpoint, "mock")
    assert np.array_equal(np.asarray(embeds), ref_embeds)
    assert got == ref and len(got["img"]) == 16

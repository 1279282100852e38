"""Follow-ups from the QA pass: OpenAI's top_p=0 and HEAD /health."""

from __future__ import annotations

import httpx
import numpy as np

from atlas_core.engine.sampling_params import TOP_P_MIN, SamplingParams
from atlas_core.ops import reference
from atlas_core.server import ServerConfig, create_app
from atlas_core.server.launch import ServerThread
from test_server_support import FakeAsyncEngine


def test_top_p_zero_keeps_only_the_most_likely_token():
    params = SamplingParams(top_p=0.0, temperature=1.0)
    assert params.top_p == TOP_P_MIN
    logits = np.random.default_rng(0).standard_normal((4, 50)).astype(np.float32)
    n = len(logits)
    out = reference.sample(logits, np.ones(n, np.float32), np.zeros(n, np.int32),
                           np.full(n, params.top_p, np.float32), np.zeros(n, np.float32),
                           np.arange(n, dtype=np.uint64), np.zeros(n, np.int64))
    np.testing.assert_array_equal(out, logits.argmax(axis=1))


def test_head_health():
    app = create_app(FakeAsyncEngine(), ServerConfig(served_model_names=["fake"]))
    with ServerThread(app) as server:
        response = httpx.head(f"{server.url}/health")
        assert response.status_code in (200, 503)

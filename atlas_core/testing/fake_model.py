"""A CausalLM-shaped fake for engine tests: logits are a deterministic function of the context.

The fake really uses the paged KV cache: ``forward`` writes each token id into its cache slot
and reads every row's context back through the block table, so wrong slot mappings, block
tables or prefix-cache hits change the logits and fail the tests that compare runs. Works on
backends whose arrays are NumPy arrays (``numpy``, ``mock``).

The engine helpers at the end drive any engine, fake or real: :func:`make_engine` (a small
engine over a checkpoint directory), :func:`run_requests`, :func:`assert_same_completion`,
:func:`assert_engine_drained` (hybrid models: every block and state slot back) and
:func:`assert_graph_decode_steps` (the mock backend's decode discipline).
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Sequence

import numpy as np

from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.interfaces.layer import KVCacheSpec

#: Greedy, 5 tokens with the top-3 logprobs, past end of sequence: :func:`run_requests`'s default.
GREEDY = SamplingParams(temperature=0, max_tokens=5, logprobs=3, ignore_eos=True)


class FakeCausalLM:
    """Pseudo-random next-token logits keyed by the whole context.

    Args:
        backend: a NumPy-array backend.
        vocab_size: logits width.
        num_layers: KV-holding layers (each stores the tokens).
        max_position_embeddings: the model's context limit.
        script: optional ``context_ids -> token id | None``; when it returns a token, that
            token's logit is made far larger than the rest (a scripted continuation).
    """

    def __init__(self, backend, vocab_size: int = 64, num_layers: int = 1,
                 max_position_embeddings: int = 512,
                 script: Callable[[list[int]], int | None] | None = None) -> None:
        self.backend = backend
        self.config = {"architectures": ["FakeCausalLM"]}
        self.vocab_size, self.num_layers = vocab_size, num_layers
        self.hidden_size = 1
        self.dtype = np.dtype(np.float32)
        self.max_position_embeddings = max_position_embeddings
        self.script = script
        self.caches: list = []
        self.num_forward_tokens = 0

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        return [KVCacheSpec(num_kv_heads=1, head_dim=1)] * self.num_layers

    def bind_kv_caches(self, caches: list) -> None:
        self.caches = list(caches)

    def forward(self, input_ids, meta) -> np.ndarray:
        """Write tokens to the cache; return each row's context as hashed ids ``[T] uint64``."""
        k_cache = self.caches[0][0]
        flat = k_cache.reshape(-1)
        ids = np.asarray(input_ids, np.int64)
        slots = np.asarray(meta.slot_mapping, np.int64)
        keep = slots >= 0
        flat[slots[keep]] = ids[keep] + 1
        self.num_forward_tokens += int(keep.sum())
        cu = np.asarray(meta.cu_seqlens_q, np.int64)
        seq_lens = np.asarray(meta.seq_lens, np.int64)
        tables = np.asarray(meta.block_tables, np.int64)
        bs = k_cache.shape[1]
        out = np.zeros(len(ids), np.uint64)
        self.contexts = {}
        for b in range(len(cu) - 1):
            length = int(seq_lens[b])
            n_q = int(cu[b + 1] - cu[b])
            pos = np.arange(length)
            with np.errstate(invalid="ignore"):
                ctx = np.nan_to_num(flat[tables[b][pos // bs] * bs + pos % bs]).astype(np.int64) - 1
            for i in range(n_q):
                row = int(cu[b]) + i
                context = ctx[:length - n_q + i + 1].tolist()
                out[row] = row
                self.contexts[row] = context
        return out

    def compute_logits(self, hidden: np.ndarray, logits_indices) -> np.ndarray:
        rows = np.asarray(logits_indices, np.int64)
        logits = np.empty((len(rows), self.vocab_size), np.float32)
        for i, r in enumerate(rows):
            logits[i] = self.logits_for(self.contexts[int(hidden[r])])
        return logits

    def logits_for(self, context: list[int]) -> np.ndarray:
        """The logits this fake gives after ``context`` (float32 ``[vocab_size]``)."""
        if self.script is not None:
            forced = self.script(context)
            if forced is not None:
                logits = np.zeros(self.vocab_size, np.float32)
                logits[forced] = 30.0
                return logits
        digest = hashlib.blake2b(np.asarray(context, np.int64).tobytes(), digest_size=8).digest()
        rng = np.random.default_rng(int.from_bytes(digest, "little"))
        return (rng.standard_normal(self.vocab_size) * 3.0).astype(np.float32)

    def greedy(self, prompt: list[int], num_tokens: int) -> list[int]:
        """Reference greedy continuation computed directly (no engine)."""
        context, out = list(prompt), []
        for _ in range(num_tokens):
            token = int(np.argmax(self.logits_for(context)))
            out.append(token)
            context.append(token)
        return out


def scripted(prompt: list[int], continuation: list[int]) -> Callable[[list[int]], int | None]:
    """A script that continues exactly ``prompt`` with ``continuation`` (then free-runs)."""
    prompt = list(prompt)

    def script(context: list[int]) -> int | None:
        i = len(context) - len(prompt)
        if context[:len(prompt)] == prompt and 0 <= i < len(continuation) and \
                context[len(prompt):] == list(continuation[:i]):
            return continuation[i]
        return None
    return script


def make_fake_engine(model: FakeCausalLM | None = None, backend: str = "numpy", *, tokenizer=None,
                     eos_token_ids: set[int] | None = None, **engine_kwargs):
    """An :class:`~atlas_core.engine.LLMEngine` over a :class:`FakeCausalLM` (small defaults).

    ``backend`` (name or instance) is used only when ``model`` is not given.
    """
    from atlas_core.engine.args import EngineArgs
    from atlas_core.engine.llm_engine import LLMEngine
    from atlas_core.plugins import Registry

    if model is None:
        be = Registry().create("gpu_backends", backend) if isinstance(backend, str) else backend
        model = FakeCausalLM(be, vocab_size=max(64, getattr(tokenizer, "vocab_size", 0) or 0))
    be = model.backend
    engine_kwargs.setdefault("num_kv_blocks", 64)
    engine_kwargs.setdefault("max_num_seqs", 8)
    return LLMEngine(model, be, EngineArgs(**engine_kwargs), tokenizer=tokenizer,
                     eos_token_ids=eos_token_ids)


def run_to_completion(engine) -> dict:
    """Step ``engine`` until idle; return the final :class:`RequestOutput` of every request."""
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return final


def run_one(engine, prompt: list[int], params: SamplingParams, rid: str = "r"):
    """Add one request, step ``engine`` until idle, return that request's final output."""
    engine.add_request(rid, prompt, params)
    return run_to_completion(engine)[rid]


def assert_same_output(a, b, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Two final outputs give the same tokens and (within tolerance) the same top logprobs."""
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    for la, lb in zip(a.outputs[0].logprobs or (), b.outputs[0].logprobs or ()):
        np.testing.assert_allclose([v for _, v in la.top], [v for _, v in lb.top], rtol=rtol,
                                   atol=atol)


def make_engine(path, backend: str = "numpy", **engine_kwargs):
    """A real :class:`~atlas_core.engine.LLMEngine` over the checkpoint directory ``path`` on
    ``backend``: 64 KV blocks of 8 tokens and 4 sequences unless ``engine_kwargs`` say
    otherwise (they go to :class:`~atlas_core.engine.args.EngineArgs`)."""
    from atlas_core.engine.args import EngineArgs
    from atlas_core.engine.llm_engine import LLMEngine

    engine_kwargs = {"num_kv_blocks": 64, "max_num_seqs": 4, "block_size": 8, **engine_kwargs}
    return LLMEngine.from_args(EngineArgs(model=str(path), backend=backend, **engine_kwargs))


def run_requests(engine, prompts: Sequence[Sequence[int]], params: SamplingParams = GREEDY) -> list:
    """Add ``prompts`` as requests ``r0, r1, ...`` with ``params``, step until idle, and return
    their final :class:`RequestOutput` in prompt order."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    outs = run_to_completion(engine)
    return [outs[f"r{i}"] for i in range(len(prompts))]


def assert_same_completion(a, b, exact: bool = False) -> None:
    """The first completions of request outputs ``a`` and ``b`` have the same tokens and top
    logprobs: equal when ``exact``, else within ``rtol=1e-4, atol=1e-5`` (BLAS rounds a
    projection differently for different batch shapes)."""
    ca, cb = a.outputs[0], b.outputs[0]
    assert ca.token_ids == cb.token_ids
    for la, lb in zip(ca.logprobs, cb.logprobs):
        va, vb = [v for _, v in la.top], [v for _, v in lb.top]
        if exact:
            assert va == vb
        else:
            np.testing.assert_allclose(va, vb, rtol=1e-4, atol=1e-5)


def assert_engine_drained(engine) -> None:
    """A hybrid model's engine holds nothing: no KV block in use, every recurrent-state slot
    free, no unfinished request."""
    assert engine.block_manager.num_used_blocks == 0
    states = engine.state_cache
    assert states.num_free_slots == states.num_slots
    assert not engine.has_unfinished_requests()


def assert_graph_decode_steps(engine, steps: int, num_seqs: int) -> list[Any]:
    """Step an engine on the ``mock`` backend ``steps`` times, each recorded, and check that
    every step is a decode of ``num_seqs`` sequences replayed from one captured graph: no
    allocation, one host sync, one graph launch and no eager launch.

    Returns:
        The steps' :class:`~atlas_core.backends.mock_backend.Recording`, in order, for the
        caller's own checks (captures, captured nodes).
    """
    backend = engine.backend
    records = []
    for _ in range(steps):
        with backend.record() as rec:
            outs = engine.step()
        assert len(outs) == num_seqs
        assert rec.count("alloc") == 0, rec.names("alloc")
        assert rec.host_syncs == 1
        assert rec.count("graph_launch") == 1 and rec.count("launch") == 0
        records.append(rec)
    return records

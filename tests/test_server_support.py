"""Fakes for the server tests: a byte-level tokenizer and a scripted async engine.

No tests here; imported by tests/test_server_*.py.
"""

from __future__ import annotations

import asyncio
import random
import time
from types import SimpleNamespace

import atlas_core.engine as engine_pkg

EOS = 2
OFFSET = 3


class FakeTokenizer:
    """One token per UTF-8 byte (id = byte + 3); 0 pad, 1 bos, 2 eos."""

    vocab_size = 256 + OFFSET
    eos_token_ids = {EOS}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = [b + OFFSET for b in text.encode()]
        return ([1] + ids) if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        specials = {0: "<pad>", 1: "<s>", 2: "</s>"}
        out, raw = [], bytearray()
        for i in ids:
            if i >= OFFSET:
                raw.append(i - OFFSET)
                continue
            out.append(raw.decode(errors="replace"))
            raw = bytearray()
            if not skip_special_tokens:
                out.append(specials[i])
        out.append(raw.decode(errors="replace"))
        return "".join(out)

    def apply_chat_template(self, messages, *, tools=None, add_generation_prompt=True, **kwargs):
        text = "".join(f"<{m['role']}>{m.get('content') or ''}\n" for m in messages)
        if kwargs.get("enable_thinking"):
            text += "<think-on>"
        return text + ("<assistant>" if add_generation_prompt else "")


class FakeAsyncEngine:
    """Scripted engine: replies ``"Hello from atlas! " * k`` (random letters when sampling
    without a seed), one token per ``delay`` seconds, then EOS."""

    def __init__(self, reply: str = "Hello from atlas! ", delay: float = 0.001,
                 max_seq_len: int = 512, num_kv_blocks: int = 64, max_running: int | None = None):
        self.max_running = max_running
        self.tokenizer = FakeTokenizer()
        self.max_seq_len = max_seq_len
        self.reply = reply
        self.delay = delay
        self.num_kv_blocks = num_kv_blocks
        self.running: set[str] = set()
        self.aborted: set[str] = set()
        self.seen_prompts: list[list[int]] = []
        self.requests: list = []

    def _script(self, prompt, params, index):
        if params.temperature == 0 or params.seed is not None:
            rng = random.Random((params.seed or 0) + index)
            if params.temperature == 0:
                return self.tokenizer.encode(self.reply * 50)
            return [rng.randrange(ord("a"), ord("z") + 1) + OFFSET for _ in range(200)]
        return [random.randrange(ord("a"), ord("z") + 1) + OFFSET for _ in range(200)]

    async def generate(self, request_id, prompt_token_ids, params):
        if self.max_running is not None and len(self.running) >= self.max_running:
            raise engine_pkg.QueueFull(f"{len(self.running)} requests are already waiting")
        self.requests.append((request_id, list(prompt_token_ids), params))
        cached = len(prompt_token_ids) - 1 if prompt_token_ids in self.seen_prompts else 0
        self.seen_prompts.append(list(prompt_token_ids))
        scripts = [self._script(prompt_token_ids, params, i) for i in range(params.n)]
        limit = params.max_tokens or 16
        states = [SimpleNamespace(ids=[], finish=None, stop=None) for _ in range(params.n)]
        self.running.add(request_id)
        try:
            for step in range(limit + 1):
                await asyncio.sleep(self.delay)
                if request_id in self.aborted:
                    for st in states:
                        st.finish = st.finish or "abort"
                    yield self._output(request_id, prompt_token_ids, states, params, cached)
                    return
                for st, script in zip(states, scripts):
                    if st.finish:
                        continue
                    token = script[step] if step < len(script) else EOS
                    if token == EOS and not params.ignore_eos:
                        st.finish = "stop"
                        continue
                    st.ids.append(token)
                    text = self.tokenizer.decode(st.ids)
                    for s in params.stop or []:
                        if s in text:
                            st.finish, st.stop = "stop", s
                    if not st.finish and len(st.ids) >= limit:
                        st.finish = "length"
                yield self._output(request_id, prompt_token_ids, states, params, cached)
                if all(st.finish for st in states):
                    return
        finally:
            self.running.discard(request_id)

    def _output(self, request_id, prompt, states, params, cached):
        outputs = []
        for i, st in enumerate(states):
            text = self.tokenizer.decode(st.ids)
            if st.stop:
                text = text[:text.index(st.stop)]
            logprobs = None
            if params.logprobs is not None:
                logprobs = [SimpleNamespace(token_id=t, logprob=-0.5,
                                            top=[(t, -0.5), (t + 1, -1.5), (t + 2, -2.5)][
                                                :params.logprobs])
                            for t in st.ids]
            outputs.append(SimpleNamespace(index=i, token_ids=list(st.ids), text=text,
                                           logprobs=logprobs, finish_reason=st.finish,
                                           stop_reason=st.stop))
        finished = all(st.finish for st in states)
        prompt_lps = None
        if params.prompt_logprobs is not None:
            prompt_lps = [None] + [SimpleNamespace(token_id=t, logprob=-1.0, top=[(t, -1.0)])
                                   for t in prompt[1:]]
        return SimpleNamespace(request_id=request_id, prompt_token_ids=prompt, outputs=outputs,
                               finished=finished, num_cached_tokens=cached,
                               prompt_logprobs=prompt_lps)

    async def abort(self, request_id):
        if request_id in self.running:
            self.aborted.add(request_id)

    def stats(self):
        return SimpleNamespace(num_running=len(self.running), num_waiting=0,
                               num_kv_blocks_used=len(self.running),
                               num_kv_blocks_total=self.num_kv_blocks, prefix_cache_hits=0,
                               prefix_cache_queries=0, num_preemptions=0)


def wait_until(condition, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``condition()`` until true or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def tiny_engine(directory, **engine_args):
    """An ``AsyncLLMEngine`` over a tiny random Qwen3 checkpoint on the numpy backend."""
    from atlas_core.engine import AsyncLLMEngine, EngineArgs, LLMEngine
    from atlas_core.testing.checkpoints import write_tiny_checkpoint

    if not (directory / "config.json").exists():
        write_tiny_checkpoint("Qwen3ForCausalLM", directory)
    args = {"backend": "numpy", "max_seq_len": 256, "num_kv_blocks": 128, **engine_args}
    return AsyncLLMEngine(LLMEngine.from_args(EngineArgs(model=str(directory), **args)))

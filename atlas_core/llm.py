"""The offline API: ``LLM(model).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import itertools
from typing import Any, Sequence

from atlas_core.engine.args import EngineArgs
from atlas_core.engine.llm_engine import LLMEngine
from atlas_core.engine.outputs import RequestOutput
from atlas_core.engine.sampling_params import SamplingParams

Prompt = str | list[int] | dict


class LLM:
    """Batch generation on one model, in-process.

    >>> llm = LLM("Qwen/Qwen3-0.6B")
    >>> out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8))
    >>> out[0].outputs[0].text

    Args:
        model: local directory or Hugging Face id; ``None`` is the built-in demo model.
        backend: a GpuBackend instance or registered name (default: ``ATLAS_BACKEND``, else
            ``cuda`` when a GPU is present, else ``numpy``).
        **engine_kwargs: any :class:`~atlas_core.engine.EngineArgs` field (``max_num_seqs``,
            ``num_kv_blocks``, ``dtype``…).
    """

    def __init__(self, model: str | None = None, backend: Any = None, **engine_kwargs: Any) -> None:
        unknown = set(engine_kwargs) - EngineArgs.field_names()
        if unknown:
            raise TypeError(f"unknown engine argument(s) {', '.join(sorted(unknown))}; valid: "
                            f"{', '.join(sorted(EngineArgs.field_names() - {'model', 'backend'}))}")
        name = backend if isinstance(backend, str) or backend is None else None
        self.args = EngineArgs(model=model, backend=name, **engine_kwargs)
        self.engine = LLMEngine.from_args(self.args, backend=None if name else backend)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def prompt_token_ids(self, prompt: Prompt) -> list[int]:
        """The token ids ``generate`` would use for ``prompt``."""
        return self._prompt_ids(prompt)[0]

    def _prompt_ids(self, prompt: Prompt) -> tuple[list[int], str | None]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return list(prompt["prompt_token_ids"]), prompt.get("prompt")
            prompt = prompt["prompt"]
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer; pass prompt token ids instead of text")
            return self.tokenizer.encode(prompt, add_special_tokens=True), prompt
        return [int(t) for t in prompt], None

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 ) -> list[RequestOutput]:
        """Generate for every prompt; returns one finished :class:`RequestOutput` per prompt.

        Args:
            prompts: a string, a list of token ids, a ``{"prompt_token_ids": [...]}`` dict, or a
                list of those.
            sampling_params: one for all prompts, or one per prompt (default: the model's
                generation_config defaults with ``max_tokens=16``).
        """
        if isinstance(prompts, (str, dict)) or (
                isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = self.engine.default_sampling_params()
        params = (list(sampling_params) if isinstance(sampling_params, (list, tuple))
                  else [sampling_params] * len(prompts))
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling_params for {len(prompts)} prompts; "
                             "pass one, or one per prompt")
        order, texts = [], {}
        for prompt, p in zip(prompts, params):
            ids, text = self._prompt_ids(prompt)
            request_id = f"llm-{next(self._ids)}"
            self.engine.add_request(request_id, ids, p)
            order.append(request_id)
            texts[request_id] = text
        return self._run(order, texts)

    def _run(self, order: list[str], texts: dict) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        try:
            while len(done) < len(order):
                for out in self.engine.step():
                    if out.finished:
                        out.prompt = texts.get(out.request_id)
                        done[out.request_id] = out
        except BaseException:
            for request_id in order:
                self.engine.abort_request(request_id)
            raise
        return [done[r] for r in order]

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
             tools: list[dict] | None = None, add_generation_prompt: bool = True,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """Render each conversation with the model's chat template and generate a reply.

        Args:
            messages: one conversation (a list of ``{"role", "content"}`` dicts) or a list of them.
            sampling_params: as :meth:`generate`.
            tools: tool schemas passed to the template.
            add_generation_prompt: end the prompt with the assistant turn's opening.
            chat_template_kwargs: extra template variables (``enable_thinking``…).
        """
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer, so it has no chat template")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = []
        for conv in conversations:
            text = self.tokenizer.apply_chat_template(
                conv, tools=tools, add_generation_prompt=add_generation_prompt,
                **(chat_template_kwargs or {}))
            prompts.append({"prompt_token_ids": self.tokenizer.encode(text), "prompt": text})
        return self.generate(prompts, sampling_params)

"""``atlas generate``: run prompts through a model offline and print the completions."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from atlas_core.cli._arg_types import add_model_arguments
from atlas_core.cli._speculative import add_speculative_arguments, speculative_config


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("generate", help="generate text for prompts (offline, no server)",
                              description="Generate completions for one or more prompts.")
    add_model_arguments(p, "model directory or Hugging Face id (default: the built-in demo model)")
    p.add_argument("--prompt", "-p", action="append", default=[],
                   help="prompt text (repeatable; default: read stdin)")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap each prompt as a user chat message (default: when the model has a "
                        "chat template)")
    p.add_argument("--show-reasoning", action="store_true",
                   help="also print the model's think block (default: print only the answer)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default: 64)")
    p.add_argument("--min-tokens", type=int, default=0,
                   help="tokens to generate before a stop or EOS counts (default: 0)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: the model's generation_config, else 1)")
    p.add_argument("--top-p", type=float, default=None,
                   help="nucleus sampling mass (default: the model's generation_config, else 1)")
    p.add_argument("--top-k", type=int, default=None,
                   help="sample from the K likeliest tokens (default: the model's "
                        "generation_config, else all)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    p.add_argument("--n", type=int, default=1, help="completions per prompt (default: 1)")
    p.add_argument("--stop", action="append", default=None,
                   help="stop string (repeatable; default: none)")
    p.add_argument("--logprobs", type=int, default=None, metavar="K",
                   help="return the top K logprobs of every generated token (default: none)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="keep generating past EOS until --max-tokens (default: stop at EOS)")
    p.add_argument("--backend", default=None, help="GpuBackend name (default: ATLAS_BACKEND, "
                   "else cuda when a GPU is present, else numpy)")
    p.add_argument("--dtype", default=None,
                   help="weight / activation dtype, e.g. bfloat16 or float32 (default: the "
                        "checkpoint's)")
    p.add_argument("--max-seq-len", "--max-model-len", type=int, default=None,
                   help="longest prompt + output in tokens (default: the model's limit, capped by "
                        "the KV cache)")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV-cache blocks (default: sized from --gpu-memory-utilization)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of device memory the engine may take (default: 0.9)")
    p.add_argument("--json", action="store_true",
                   help="print JSON: token ids, text, reasoning, logprobs (default: plain text)")
    add_speculative_arguments(p)
    return p


def _sampling_params(llm, args):
    given = {"max_tokens": args.max_tokens, "min_tokens": args.min_tokens, "seed": args.seed,
             "n": args.n, "stop": args.stop, "logprobs": args.logprobs,
             "ignore_eos": args.ignore_eos, "temperature": args.temperature,
             "top_p": args.top_p, "top_k": args.top_k}
    return llm.engine.default_sampling_params(**{k: v for k, v in given.items() if v is not None})


def _token_text(tok, token_id: int) -> str | None:
    return tok.decode([token_id], skip_special_tokens=False) if tok is not None else None


def _logprobs_json(tok, logprobs):
    if logprobs is None:
        return None
    return [{"token_id": lp.token_id, "token": _token_text(tok, lp.token_id), "logprob": lp.logprob,
             "top": [{"token_id": t, "token": _token_text(tok, t), "logprob": v} for t, v in lp.top]}
            for lp in logprobs]


def to_json(llm, outputs, in_reasoning: bool = False) -> list[dict]:
    """Plain-data form of the outputs of ``LLM.generate`` (what ``--json`` prints).

    ``text`` is the whole output; ``content`` and ``reasoning`` split off a leading think block
    (``reasoning`` is None when there is none).
    """
    tok = llm.tokenizer
    split = _reasoning_splitter(in_reasoning)
    return [{"prompt": out.prompt, "prompt_token_ids": out.prompt_token_ids,
             "num_cached_tokens": out.num_cached_tokens,
             "outputs": [{"index": c.index, "token_ids": c.token_ids, "text": c.text,
                          **_split_output(split, c.text),
                          "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                          "logprobs": _logprobs_json(tok, c.logprobs)} for c in out.outputs]}
            for out in outputs]


def _reasoning_splitter(in_reasoning: bool):
    """Splits a leading ``<think>`` block (or, when the prompt opened one, the text up to its
    end) off an output; outputs that do not open one stay whole."""
    from atlas_core.parsers import ReasoningParser
    return ReasoningParser(in_reasoning=in_reasoning)


def _split_output(split, text: str) -> dict:
    parsed = split.parse(text)
    return {"content": parsed.content, "reasoning": parsed.reasoning}


def _chat_prompts(llm, prompts: list[str], chat: bool | None) -> tuple[list, bool]:
    """The prompts to generate from and whether the rendered prompt opens a think block.

    ``chat`` None means: use the chat template when the model has one.
    """
    from atlas_core.cli import UserError
    from atlas_core.parsers import prompt_opens_reasoning
    has_template = llm.tokenizer.chat_template is not None
    if chat and not has_template:
        raise UserError("this model has no chat template; drop --chat to send the prompt as raw "
                        "text")
    if not (has_template if chat is None else chat):
        return prompts, False
    rendered = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}])
                for p in prompts]
    opens = any(prompt_opens_reasoning(t) for t in rendered)
    return [{"prompt_token_ids": llm.tokenizer.encode(t), "prompt": t} for t in rendered], opens


def _print_text(outputs, user_prompts: list, in_reasoning: bool, show_reasoning: bool) -> None:
    split = _reasoning_splitter(in_reasoning)
    for out, user_prompt in zip(outputs, user_prompts):
        for c in out.outputs:
            suffix = f" [{c.index}]" if len(out.outputs) > 1 else ""
            print(f"--- prompt {user_prompt!r}{suffix}")
            parts = _split_output(split, c.text)
            if parts["reasoning"] and show_reasoning:
                print(f"[reasoning]\n{parts['reasoning']}\n[answer]")
            print(parts["content"])
            note = ""
            if parts["reasoning"] and not parts["content"] and not show_reasoning:
                note = " (only reasoning so far: raise --max-tokens or pass --show-reasoning)"
            print(f"--- {len(c.token_ids)} tokens, finish_reason={c.finish_reason}{note}")


def run(args) -> int:
    from atlas_core.cli import UserError
    from atlas_core.llm import LLM

    if args.model and " " in args.model and not Path(args.model).expanduser().exists():
        raise UserError(f"{args.model!r} looks like a prompt, not a model; pass prompts with -p, "
                        f"e.g. atlas generate -p {shlex.quote(args.model)}")
    user_prompts = args.prompt
    if not user_prompts:
        if sys.stdin.isatty():
            raise UserError("no prompt given; pass --prompt TEXT (repeatable) or pipe text on stdin")
        user_prompts = [sys.stdin.read()]
    try:
        llm = LLM(args.model, backend=args.backend, dtype=args.dtype, max_seq_len=args.max_seq_len,
                  num_kv_blocks=args.num_kv_blocks,
                  gpu_memory_utilization=args.gpu_memory_utilization,
                  speculative_config=speculative_config(args, args.model))
        if llm.tokenizer is None:
            raise UserError(f"{args.model} has no tokenizer (tokenizer.json + "
                            "tokenizer_config.json); copy them from the original model")
        params = _sampling_params(llm, args)
        prompts, in_reasoning = _chat_prompts(llm, user_prompts, args.chat)
        for prompt in prompts:
            llm.engine.validate_request(llm.prompt_token_ids(prompt), params)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise UserError(str(exc).strip("'\"")) from None
    outputs = llm.generate(prompts, params)
    if args.json:
        print(json.dumps(to_json(llm, outputs, in_reasoning), indent=2, ensure_ascii=False))
    else:
        _print_text(outputs, user_prompts, in_reasoning, args.show_reasoning)
    return 0

"""``atlas generate``: run prompts through a model offline and print the completions."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("generate", help="generate text for prompts (offline, no server)",
                              description="Generate completions for one or more prompts.")
    p.add_argument("model", nargs="?", default=None,
                   help="model directory or Hugging Face id (default: the built-in demo model)")
    p.add_argument("--prompt", "-p", action="append", default=[],
                   help="prompt text (repeatable; default: read stdin)")
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user chat message")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument("--min-tokens", type=int, default=0)
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: the model's generation_config, else 1)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--n", type=int, default=1, help="completions per prompt")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--logprobs", type=int, default=None, metavar="K",
                   help="return the top K logprobs of every generated token")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--backend", default=None, help="GpuBackend name (default: ATLAS_BACKEND, "
                   "else cuda when a GPU is present, else numpy)")
    p.add_argument("--dtype", default=None)
    p.add_argument("--max-seq-len", type=int, default=None)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--json", action="store_true", help="print JSON: token ids, text, logprobs")
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


def to_json(llm, outputs) -> list[dict]:
    """Plain-data form of the outputs of ``LLM.generate`` (what ``--json`` prints)."""
    tok = llm.tokenizer
    return [{"prompt": out.prompt, "prompt_token_ids": out.prompt_token_ids,
             "num_cached_tokens": out.num_cached_tokens,
             "outputs": [{"index": c.index, "token_ids": c.token_ids, "text": c.text,
                          "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                          "logprobs": _logprobs_json(tok, c.logprobs)} for c in out.outputs]}
            for out in outputs]


def run(args) -> int:
    from atlas_core.cli import UserError
    from atlas_core.llm import LLM

    if args.model and " " in args.model and not Path(args.model).expanduser().exists():
        raise UserError(f"{args.model!r} looks like a prompt, not a model; pass prompts with -p, "
                        f"e.g. atlas generate -p {shlex.quote(args.model)}")
    prompts = args.prompt
    if not prompts:
        if sys.stdin.isatty():
            raise UserError("no prompt given; pass --prompt TEXT (repeatable) or pipe text on stdin")
        prompts = [sys.stdin.read()]
    try:
        llm = LLM(args.model, backend=args.backend, dtype=args.dtype, max_seq_len=args.max_seq_len,
                  num_kv_blocks=args.num_kv_blocks,
                  gpu_memory_utilization=args.gpu_memory_utilization)
        if llm.tokenizer is None:
            raise UserError(f"{args.model} has no tokenizer (tokenizer.json + "
                            "tokenizer_config.json); copy them from the original model")
        params = _sampling_params(llm, args)
        if args.chat:
            conversations = [[{"role": "user", "content": p}] for p in prompts]
            prompts = [{"prompt_token_ids": llm.tokenizer.encode(t), "prompt": t} for t in (
                llm.tokenizer.apply_chat_template(c) for c in conversations)]
        for prompt in prompts:
            llm.engine.validate_request(llm.prompt_token_ids(prompt), params)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise UserError(str(exc).strip("'\"")) from None
    outputs = llm.generate(prompts, params)
    if args.json:
        print(json.dumps(to_json(llm, outputs), indent=2, ensure_ascii=False))
        return 0
    for out in outputs:
        for c in out.outputs:
            header = f"--- prompt {out.prompt!r}" + (f" [{c.index}]" if len(out.outputs) > 1 else "")
            print(header)
            print(c.text if llm.tokenizer is not None else c.token_ids)
            print(f"--- {len(c.token_ids)} tokens, finish_reason={c.finish_reason}")
    return 0

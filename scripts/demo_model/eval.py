"""Held-out evaluation of the demo model: accuracy per skill under greedy decoding.

    python scripts/demo_model/eval.py                       # through Atlas (numpy backend)
    python scripts/demo_model/eval.py --hf --device cuda    # through HF transformers

Prompts use numbers and cities that the training corpus never holds, and for facts and the
`*_para` skills also phrasings it never holds (corpus.build_eval_set); tools are the canonical
ones of docs/demo-model.md.
"""

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
import render  # noqa: E402

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "atlas_core" / "assets" / "atlas-demo"
COUNTS = {"arith": 300, "capital": 100, "country": 50, "weather_call": 60, "calc_call": 60,
          "weather_answer": 60, "calc_answer": 60, "weather_notool": 20, "chat": 20,
          "arith_para": 100, "weather_call_para": 40, "calc_call_para": 40}
GROUPS = {"arithmetic": ["arith"], "facts": ["capital", "country"],
          "tool_calls": ["weather_call", "calc_call"],
          "tool_results": ["weather_answer", "calc_answer"],
          "other": ["weather_notool", "chat"],
          "paraphrases": ["arith_para", "weather_call_para", "calc_call_para"]}
TARGETS = {"arithmetic": 0.90, "facts": 0.95, "tool_calls": 0.90, "tool_results": 0.90}
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_INT = re.compile(r"-?\d+")


def answer_text(text: str) -> str:
    """The reply without its think block."""
    return text.split("</think>")[-1].strip()


def parse_tool_call(text: str):
    """The first hermes-format tool call in `text` as a dict, or None."""
    m = _TOOL_CALL.search(text)
    try:
        return json.loads(m.group(1)) if m else None
    except json.JSONDecodeError:
        return None


def is_correct(ex: corpus.Example, text: str) -> bool:
    """Checks one generated reply against the example's expectation."""
    exp, reply, skill = ex.expected, answer_text(text), ex.skill.removesuffix("_para")
    if skill in ("weather_call", "calc_call"):
        call = parse_tool_call(reply)
        if not call or call.get("name") != exp["name"]:
            return False
        args = call.get("arguments")
        if exp["name"] == "calculate":
            expr = args.get("expression", "") if isinstance(args, dict) else ""
            return expr.replace(" ", "") == exp["arguments"]["expression"].replace(" ", "")
        return args == exp["arguments"]
    if skill in ("arith", "calc_answer"):
        tail = reply.split("=")[-1]
        nums = _INT.findall(tail)
        return "<tool_call>" not in reply and bool(nums) and int(nums[-1]) == exp["result"]
    if skill == "weather_answer":
        temps = [int(t) for t in re.findall(r"(-?\d+)\s*°", reply)]
        return exp["city"] in reply and exp["condition"] in reply and temps == [exp["temperature"]]
    if skill in ("capital", "country"):
        return exp["answer"] in reply and "<tool_call>" not in reply
    return reply == exp["answer"]


def generate_hf(model_dir: Path, prompts: list[str], device: str, max_new_tokens: int,
                batch_size: int = 64):
    """Greedy replies through HF transformers, in left-padded batches of similar length."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    encoded = [tok.encode(p, add_special_tokens=False).ids for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
    replies = [""] * len(prompts)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        width = max(len(encoded[i]) for i in chunk)
        x = torch.full((len(chunk), width), eos[1], dtype=torch.long)
        mask = torch.zeros_like(x)
        for row, i in enumerate(chunk):
            x[row, width - len(encoded[i]):] = torch.tensor(encoded[i])
            mask[row, width - len(encoded[i]):] = 1
        with torch.no_grad():
            out = model.generate(x.to(device), attention_mask=mask.to(device), do_sample=False,
                                 top_k=None, top_p=None, temperature=None,
                                 max_new_tokens=max_new_tokens, eos_token_id=eos,
                                 pad_token_id=eos[1])
        for i, row in zip(chunk, out[:, width:].tolist()):
            replies[i] = tok.decode(row, skip_special_tokens=True)
    return replies


def generate_atlas(model_dir: Path, examples: list, max_new_tokens: int):
    """Greedy replies through Atlas's offline LLM API on the numpy backend.

    Prompts are rendered by Atlas's own tokenizer (its chat template), not by render.py.
    """
    from atlas_core import LLM, SamplingParams
    llm = LLM(str(model_dir), backend="numpy")
    prompts = [{"prompt_token_ids": llm.tokenizer.encode(llm.tokenizer.apply_chat_template(
        ex.messages[:-1], tools=ex.tools, add_generation_prompt=True))} for ex in examples]
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    return [out.outputs[0].text for out in llm.generate(prompts, params)]


def evaluate(replies: list[str], examples: list[corpus.Example]) -> dict:
    """Accuracy per skill and per group of skills."""
    per_skill = defaultdict(list)
    for ex, reply in zip(examples, replies):
        per_skill[ex.skill].append(is_correct(ex, reply))
    skills = {s: sum(v) / len(v) for s, v in per_skill.items()}
    groups = {}
    for g, members in GROUPS.items():
        hits = [h for s in members for h in per_skill.get(s, [])]
        if hits:
            groups[g] = sum(hits) / len(hits)
    return {"skills": skills, "groups": groups, "counts": {s: len(v) for s, v in per_skill.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--hf", action="store_true", help="use HF transformers instead of Atlas")
    p.add_argument("--device", default="cpu", help="torch device for --hf")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--scale", type=float, default=1.0, help="multiply the prompt counts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--json", type=Path, help="write results and failures here")
    args = p.parse_args(argv)
    counts = {s: max(1, round(n * args.scale)) for s, n in COUNTS.items()}
    examples = corpus.build_eval_set(args.seed, counts)
    t0 = time.time()
    if args.hf:
        prompts = [render.render(ex.messages[:-1], ex.tools, add_generation_prompt=True)
                   for ex in examples]
        replies = generate_hf(args.model, prompts, args.device, args.max_new_tokens)
    else:
        replies = generate_atlas(args.model, examples, args.max_new_tokens)
    result = evaluate(replies, examples)
    result["seconds"] = round(time.time() - t0, 1)
    shown = set()
    for ex, reply in zip(examples, replies):
        if ex.skill not in shown:
            shown.add(ex.skill)
            print(f"[{ex.skill}] {ex.messages[-2]['content']!r} -> {answer_text(reply)!r}")
    for s, acc in result["skills"].items():
        print(f"{s:16s} {acc:7.1%}  (n={result['counts'][s]})")
    ok = True
    for g, acc in result["groups"].items():
        target = TARGETS.get(g)
        ok &= target is None or acc >= target
        print(f"== {g:13s} {acc:7.1%}" + (f"  target {target:.0%}" if target else ""))
    print(f"{len(examples)} prompts in {result['seconds']}s via {'HF' if args.hf else 'Atlas'}")
    if args.json:
        result["failures"] = [{"skill": ex.skill, "prompt": ex.messages[-2]["content"],
                               "reply": r, "expected": ex.expected}
                              for ex, r in zip(examples, replies) if not is_correct(ex, r)]
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

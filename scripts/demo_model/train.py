"""Trains Atlas's built-in demo model (Qwen3 architecture) on the synthetic chat corpus.

    python scripts/demo_model/train.py --out /tmp/atlas-demo            # GPU if there is one
    python scripts/demo_model/train.py --out /tmp/d --repro-steps 50    # + reproducibility check

Writes config.json, generation_config.json, model.safetensors (bf16), tokenizer.json and
tokenizer_config.json into --out and prints the sha256 of the weights. Needs the `train` extra
(torch, transformers). See docs/demo-model.md.
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import build_tokenizer  # noqa: E402
import dataset  # noqa: E402

VOCAB_SIZE = 2048
MAX_LEN = 384
MODEL_SHAPE = {"hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 768}


def model_config(tok) -> dict:
    """config.json in the layout of the real Qwen3 checkpoints."""
    return {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": tok.token_to_id("<|endoftext|>"),
        "eos_token_id": tok.token_to_id("<|im_end|>"), **MODEL_SHAPE, "hidden_act": "silu",
        "initializer_range": 0.02, "max_position_embeddings": 2048,
        "max_window_layers": MODEL_SHAPE["num_hidden_layers"], "model_type": "qwen3",
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000.0,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_cache": True, "use_sliding_window": False, "vocab_size": VOCAB_SIZE,
    }


def generation_config(tok) -> dict:
    """Greedy by default (do_sample false): the demo should give its one best answer."""
    eot, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    return {"bos_token_id": eot, "do_sample": False, "eos_token_id": [im_end, eot],
            "pad_token_id": eot}


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def prepare(args, out: Path):
    """Renders the corpus, builds the tokenizer and writes every file but the weights."""
    t0 = time.time()
    rows = dataset.render_corpus(args.seed, args.num_examples, args.workers)
    t1 = time.time()
    texts = (p + c for _, p, c in rows[:args.tokenizer_examples])
    tok = build_tokenizer.train_tokenizer(texts, VOCAB_SIZE)
    build_tokenizer.save_tokenizer(tok, out, 2048)
    write_json(out / "config.json", model_config(tok))
    write_json(out / "generation_config.json", generation_config(tok))
    seqs, prompt_lens, _ = dataset.tokenize(tok, rows, MAX_LEN)
    print(f"corpus: {len(rows)} examples rendered in {t1 - t0:.1f}s, {len(seqs)} kept, "
          f"{sum(map(len, seqs)) / len(seqs):.0f} tokens on average; tokenizer sha256 "
          f"{sha256(out / 'tokenizer.json')}; prepared in {time.time() - t0:.1f}s", flush=True)
    return tok, seqs, prompt_lens


def lr_at(step: int, total: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, total - args.warmup)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(frac, 1.0))))


def train(args, out: Path, data, steps: int, device) -> tuple[int, float]:
    """Trains from scratch for `steps` steps and saves model.safetensors into `out`.

    With --max-train-seconds, the step count is lowered after the first 60 steps to fit the
    budget; the warmup (100 steps) does not depend on it, so the result equals a run started
    with that step count. Returns (steps run, seconds).
    """
    from transformers import AutoConfig, Qwen3ForCausalLM
    torch.manual_seed(args.seed)
    config = AutoConfig.from_pretrained(out)
    config._attn_implementation = "eager"
    model = Qwen3ForCausalLM(config).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    batches = dataset.batches(data[1], data[2], args.batch_size, args.seed,
                              data[0].token_to_id("<|endoftext|>"))
    use_amp = device.type == "cuda"
    t0 = time.time()
    step = 0
    while step < steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, args)
        x, y = (torch.from_numpy(a).to(device) for a in next(batches))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
            hidden = model.model(input_ids=x, use_cache=False).last_hidden_state
            idx = (y.view(-1) != -100).nonzero().squeeze(1)
            logits = model.lm_head(hidden.reshape(-1, hidden.shape[-1])[idx])
        # NLLLoss has no deterministic CUDA kernel; log_softmax + gather does
        logp = logits.float().log_softmax(-1)
        loss = -logp.gather(1, y.view(-1)[idx, None]).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step == 10:
            t10 = time.time()
        if step == 60 and args.max_train_seconds:
            per_step = (time.time() - t10) / 50
            steps = min(steps, int(args.max_train_seconds / per_step))
            print(f"  {per_step * 1000:.0f} ms/step: running {steps} steps", flush=True)
        if step % args.log_every == 0 or step == steps:
            lr = lr_at(step - 1, steps, args)
            print(f"  step {step}/{steps} loss {loss.item():.4f} lr {lr:.2e} "
                  f"{time.time() - t0:.0f}s", flush=True)
    save_weights(model, out / "model.safetensors")
    return steps, time.time() - t0


def save_weights(model, path: Path) -> None:
    """Saves bf16 weights under the HF names; lm_head is tied to embed_tokens, so it is left out."""
    state = {k: v.detach().to(torch.bfloat16).cpu().contiguous()
             for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(dict(sorted(state.items())), str(path), metadata={"format": "pt"})


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output model directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-examples", type=int, default=400_000)
    p.add_argument("--tokenizer-examples", type=int, default=30_000)
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--max-train-seconds", type=float, default=0.0,
                   help="lower --steps after 60 steps to fit this budget (0: off)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--repro-steps", type=int, default=0,
                   help="first train this many steps twice and compare weight hashes")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--log-every", type=int, default=100)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.use_deterministic_algorithms(True)
    device = torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    data = prepare(args, args.out)
    if args.repro_steps:
        hashes = []
        for _ in range(2):
            n, secs = train(args, args.out, data, args.repro_steps, device)
            hashes.append(sha256(args.out / "model.safetensors"))
            print(f"repro run: {n} steps in {secs:.1f}s, weights sha256 {hashes[-1]}", flush=True)
        print(f"reproducible: {hashes[0] == hashes[1]}", flush=True)
    steps, secs = train(args, args.out, data, args.steps, device)
    path = args.out / "model.safetensors"
    print(f"trained {steps} steps in {secs:.1f}s on {args.device}; "
          f"model.safetensors {path.stat().st_size} bytes sha256 {sha256(path)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

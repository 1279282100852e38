"""Trains a multi-token-prediction (MTP) head for the demo model, the base model frozen.

    python scripts/demo_model/train_mtp.py                   # into atlas_core/assets/atlas-demo
    python scripts/demo_model/train_mtp.py --out /tmp/d --steps 200

The head has the Qwen3.5 layout that Atlas loads for any decoder-only checkpoint (see
``DecoderOnlyLoader.build_mtp``): at position ``t``, ``fc([norm(embed(x[t+1])); norm(h[t])])``
-> one Qwen3 decoder block of the base model's shape -> ``norm`` -> the tied ``lm_head``
predicts ``x[t+2]``, where ``h[t]`` is the base model's final hidden state. The loss is the
cross entropy of ``x[t+2]`` over the assistant turn, as in train.py. The head is written as bf16
``mtp.*`` tensors to ``mtp.safetensors`` next to ``model.safetensors`` (HF transformers reads
only the latter), and config.json gets ``"mtp_num_hidden_layers": 1``. See docs/demo-model.md.
"""

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import dataset  # noqa: E402

DEMO_DIR = Path(__file__).resolve().parents[2] / "atlas_core" / "assets" / "atlas-demo"
MAX_LEN = 384


class MTPHead(nn.Module):
    """The head, named as in the checkpoint (under ``mtp.``)."""

    def __init__(self, config) -> None:
        from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = Qwen3RMSNorm(hidden, eps)
        self.pre_fc_norm_hidden = Qwen3RMSNorm(hidden, eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([Qwen3DecoderLayer(config, layer_idx=0)])
        self.norm = Qwen3RMSNorm(hidden, eps)

    def forward(self, embedded, hidden, position_embeddings):
        # embedded, hidden: [batch, seq, hidden]; sdpa with no mask is causal
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embedded),
                               self.pre_fc_norm_hidden(hidden)], -1))
        x = self.layers[0](x, attention_mask=None, position_embeddings=position_embeddings)
        return self.norm(x[0] if isinstance(x, tuple) else x)


def load_base(model_dir: Path):
    from transformers import Qwen3ForCausalLM
    base = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                            attn_implementation="sdpa").eval()
    for p in base.parameters():
        p.requires_grad_(False)
    return base


def mtp_step(base, head, x, labels):
    """(logits of x[t+2] where it is a target [n, vocab], targets [n], base's own argmax
    of x[t+2] there [n])."""
    with torch.no_grad():
        hidden = base.model(input_ids=x, use_cache=False).last_hidden_state
    # position t: the embedding of x[t+1] and h[t] predict x[t+2] = labels[t + 1]
    targets = labels[:, 1:].clone()
    targets[labels[:, :-1] == -100] = -100
    positions = torch.arange(x.shape[1] - 1)[None].expand(x.shape[0], -1)
    embedded = base.model.embed_tokens(x[:, 1:])
    cos_sin = base.model.rotary_emb(embedded, positions)
    out = head(embedded, hidden[:, :-1], cos_sin)
    idx = (targets.reshape(-1) != -100).nonzero().squeeze(1)
    logits = base.lm_head(out.reshape(-1, out.shape[-1])[idx])
    with torch.no_grad():
        base_next = base.lm_head(hidden[:, 1:].reshape(-1, hidden.shape[-1])[idx]).argmax(-1)
    return logits, targets.reshape(-1)[idx], base_next


def lr_at(step: int, total: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, total - args.warmup)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(frac, 1.0))))


def evaluate(base, head, batches) -> dict:
    """Loss and accuracy of x[t+2] over held-out batches; ``base_agreement``: how often the
    head's argmax is the base model's own prediction of x[t+2] (a first draft's acceptance
    under teacher forcing)."""
    total, count, correct, agree = 0.0, 0, 0, 0
    with torch.no_grad():
        for x, y in batches:
            logits, targets, base_next = mtp_step(base, head, torch.from_numpy(x),
                                                  torch.from_numpy(y))
            total += nn.functional.cross_entropy(logits, targets, reduction="sum").item()
            pred = logits.argmax(-1)
            count += len(targets)
            correct += (pred == targets).sum().item()
            agree += (pred == base_next).sum().item()
    return {"loss": total / count, "accuracy": correct / count, "base_agreement": agree / count,
            "tokens": count}


def token_data(tok, seed: int, num_examples: int, workers: int):
    rows = dataset.render_corpus(seed, num_examples, workers)
    seqs, prompt_lens, _ = dataset.tokenize(tok, rows, MAX_LEN)
    return seqs, prompt_lens


def init_from_base(head: MTPHead, base) -> None:
    """The block starts as a copy of the base model's last block (same shapes)."""
    head.layers[0].load_state_dict(base.model.layers[-1].state_dict())


def save_head(head: MTPHead, out: Path) -> Path:
    state = {f"mtp.{k}": v.detach().to(torch.bfloat16).contiguous()
             for k, v in head.state_dict().items()}
    path = out / "mtp.safetensors"
    save_file(dict(sorted(state.items())), str(path), metadata={"format": "pt"})
    path.chmod(0o644)
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config["mtp_num_hidden_layers"] = 1
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=DEMO_DIR, help="the trained demo model")
    p.add_argument("--out", type=Path, default=None, help="where to write (default: --model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-examples", type=int, default=50_000)
    p.add_argument("--eval-examples", type=int, default=2_000)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workers", type=int, default=1, help="corpus rendering processes")
    p.add_argument("--log-every", type=int, default=100)
    return p.parse_args(argv)


def main(argv=None) -> int:
    from tokenizers import Tokenizer
    args = parse_args(argv)
    out = args.out or args.model
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    t0 = time.time()
    tok = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    pad = tok.token_to_id("<|endoftext|>")
    seqs, prompt_lens = token_data(tok, args.seed, args.num_examples, args.workers)
    held_seqs, held_lens = token_data(tok, args.seed + 1, args.eval_examples, args.workers)
    held = dataset.batches(held_seqs, held_lens, 64, args.seed, pad)
    held = [next(held) for _ in range(len(held_seqs) // 64)]
    print(f"corpus: {len(seqs)} training and {len(held_seqs)} held-out conversations in "
          f"{time.time() - t0:.0f}s", flush=True)

    base = load_base(args.model)
    head = MTPHead(base.config)
    init_from_base(head, base)
    decay = [p for p in head.parameters() if p.dim() >= 2]
    no_decay = [p for p in head.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    batches = dataset.batches(seqs, prompt_lens, args.batch_size, args.seed, pad)
    t1 = time.time()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args)
        x, y = (torch.from_numpy(a) for a in next(batches))
        logits, targets, _ = mtp_step(base, head, x, y)
        loss = nn.functional.cross_entropy(logits, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            print(f"  step {step + 1}/{args.steps} loss {loss.item():.4f} "
                  f"{time.time() - t1:.0f}s", flush=True)
    train_s = time.time() - t1
    metrics = evaluate(base.eval(), head.eval(), held)
    path = save_head(head, out)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    print(f"trained {args.steps} steps in {train_s:.0f}s ({args.threads} thread); held-out "
          f"x[t+2] loss {metrics['loss']:.4f}, accuracy {metrics['accuracy']:.2%}, agreement "
          f"with the base model {metrics['base_agreement']:.2%} over {metrics['tokens']} "
          f"tokens; {path} {path.stat().st_size} bytes sha256 {digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

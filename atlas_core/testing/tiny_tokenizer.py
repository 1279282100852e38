"""A small deterministic byte-level BPE tokenizer with a ChatML (Qwen-style) chat template.

Trained with the ``tokenizers`` library on a fixed text, so the same ``vocab_size`` always gives
the same tokenizer. Used by :mod:`atlas_core.testing.checkpoints` for tiny test models.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

#: Special tokens (ids at the end of the vocabulary, in this order).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: Added, non-special tokens (kept in decoded text, like Qwen3's).
ADDED_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")

TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. A tiny model reads the text and predicts the next
token; the server streams what it writes back to the user, one piece at a time.
def forward(self, hidden, residual, meta):
    return self.mlp(self.attention(hidden)), residual
Hello! How are you today? I am fine, thank you. What is the weather in Paris? It is sunny.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159. Symbols: {"name": "get_weather",
"arguments": {"city": "Paris", "unit": "celsius"}} <tools></tools> [1, 2, 3] (a + b) * c = d;
Unicode: café, naïve, Straße, 東京, привет, 😀 — "quotes" and 'single quotes'.
You are a helpful assistant. Think step by step, then answer the question briefly.
""" * 3

CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call functions. Signatures within <tools></tools>:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nReturn each call as <tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' + (message.content or '') }}
{%- for call in message.tool_calls or [] %}
{%- set call = call.function or call %}
{{- '\\n<tool_call>\\n{"name": "' + call.name + '", "arguments": ' }}
{{- (call.arguments if call.arguments is string else call.arguments | tojson) + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE of exactly ``vocab_size`` tokens, special and added tokens last."""
    extra = len(SPECIAL_TOKENS) + len(ADDED_TOKENS)
    if vocab_size < 256 + extra:
        raise ValueError(f"vocab_size must be at least {256 + extra} for a byte-level tokenizer")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - extra, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TRAINING_TEXT], trainer=trainer)
    filler = 0
    while tok.get_vocab_size() < vocab_size - extra:
        tok.add_tokens([AddedToken(f"<|reserved_{filler}|>", special=True)])
        filler += 1
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    assert tok.get_vocab_size() == vocab_size
    return tok


def write_tokenizer(path: Path, vocab_size: int, model_max_length: int = 4096) -> dict[str, int]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json``; return the special token ids."""
    tok = build_tokenizer(vocab_size)
    tok.save(str(path / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS + ADDED_TOKENS}
    added = {str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": t in SPECIAL_TOKENS}
             for t in SPECIAL_TOKENS + ADDED_TOKENS}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "model_max_length": model_max_length, "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": added, "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return ids

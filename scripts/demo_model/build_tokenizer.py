"""Builds the demo model's byte-level BPE tokenizer and its tokenizer_config.json.

Same pipeline as the Qwen2/Qwen3 tokenizer (NFC, the Qwen2 split regex, which puts every digit in
a token of its own, then byte-level BPE), with a vocabulary of `vocab_size` learned on the corpus.
The nine chat special tokens come last, as in Qwen3.
"""

import json
import re
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

import render

SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
              "</think>"]
_SPECIAL_RE = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + TAG_TOKENS))


def train_tokenizer(texts, vocab_size: int = 2048) -> Tokenizer:
    """Learns the BPE merges on `texts` (special tokens are cut out first).

    Returns a tokenizer of at most `vocab_size` tokens (exactly that many on the full corpus),
    the last nine being the added tokens.
    """
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    byte_level = dict(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.post_processor = processors.ByteLevel(**byte_level)
    tok.decoder = decoders.ByteLevel(**byte_level)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS) - len(TAG_TOKENS), min_frequency=2,
        show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    pieces = (p for t in texts for p in _SPECIAL_RE.split(t) if p)
    tok.train_from_iterator(pieces, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    return tok


def tokenizer_config(tok: Tokenizer, max_len: int) -> dict:
    """tokenizer_config.json in the Qwen3 layout, with the Qwen3 chat template."""
    decoder = {}
    for t in SPECIAL_TOKENS + TAG_TOKENS:
        decoder[str(tok.token_to_id(t))] = {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": t in SPECIAL_TOKENS}
    return {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
        "chat_template": render.chat_template_text(), "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": max_len,
        "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }


def save_tokenizer(tok: Tokenizer, out_dir: Path, max_len: int) -> None:
    """Writes tokenizer.json and tokenizer_config.json into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"), pretty=False)
    cfg = tokenizer_config(tok, max_len)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False)
                                                   + "\n")

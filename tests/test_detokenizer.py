"""IncrementalDetokenizer: streamed pieces always add up to the full decode."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from atlas_core.testing.fixtures import real_models_dir
from atlas_core.tokenizer import IncrementalDetokenizer, Tokenizer

FIXTURES = real_models_dir()
REAL = [pytest.param(name, marks=pytest.mark.skipif(not (FIXTURES / name).is_dir(), reason="no fixtures"))
        for name in ("qwen3", "llama-3")]
TEXTS = [
    "Hello, world! The quick brown fox.",
    "你好，世界！日本語のテキストと한국어 문장。",
    "Emoji: 👩‍👩‍👧‍👦 🇫🇷 🎉🎉 ✅ and 🧑🏽‍💻 done",
    "Combining: e\u0301 a\u0308 n\u0303 Z\u0335\u0321a\u0336l\u0337g\u0338o\u0334 and ﷽",
    "Mixed\ttabs\n\nnewlines  double  spaces\u00a0nbsp — dash … ellipsis",
    "def f(x):\n    return {'α': x ** 2}  # ∑ ∫ ≈",
]


@pytest.fixture(scope="module", params=REAL)
def real_tok(request):
    return Tokenizer.from_dir(FIXTURES / request.param)


def _stream(tok, ids, prompt=(), skip=True):
    det = IncrementalDetokenizer(tok, list(prompt), skip_special_tokens=skip)
    return [det.add(i) for i in ids], det.flush()


def _check_stream(tok, ids, skip=True):
    pieces, tail = _stream(tok, ids, skip=skip)
    full = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(pieces) + tail == full
    return pieces, full


@pytest.mark.parametrize("text", TEXTS)
def test_real_text_streams_exactly(real_tok, text):
    ids = real_tok.encode(text)
    det = IncrementalDetokenizer(real_tok, [])
    emitted = ""
    for k, token_id in enumerate(ids):
        piece = det.add(token_id)
        assert "\ufffd" not in piece
        emitted += piece
        so_far = real_tok.decode(ids[:k + 1])
        if "\ufffd" not in so_far:
            assert emitted == so_far
    assert emitted + det.flush() == real_tok.decode(ids)  # qwen3 NFC-normalises on encode


def test_random_token_sequences(real_tok):
    rng = random.Random(1234)
    vocab = real_tok.vocab_size
    specials = sorted(real_tok.special_token_ids)
    for _ in range(60):
        ids = [rng.randrange(vocab) if rng.random() > 0.05 else rng.choice(specials)
               for _ in range(rng.randrange(1, 40))]
        for skip in (True, False):
            pieces, full = _check_stream(real_tok, ids, skip=skip)
            position = 0
            for piece in pieces:
                assert piece == full[position:position + len(piece)]
                position += len(piece)


def test_split_multibyte_characters_are_held_back(real_tok):
    text = "🎉世界"
    byte_tokens = [real_tok.token_to_id(t) for t in _byte_level_tokens(text)]
    pieces, tail = _stream(real_tok, byte_tokens)
    assert [p for p in pieces if p] == ["🎉", "世", "界"] and tail == ""
    pieces, tail = _stream(real_tok, byte_tokens[:2])
    assert pieces == ["", ""] and tail == real_tok.decode(byte_tokens[:2])


def _byte_level_tokens(text: str) -> list[str]:
    mapping = pre_tokenizers.ByteLevel.alphabet()
    table = {}
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    assert set(table.values()) == set(mapping)
    return [table[b] for b in text.encode("utf-8")]


def test_prompt_context_and_skipped_specials(real_tok):
    prompt = real_tok.encode("Say hi in Japanese:")
    ids = real_tok.encode(" こんにちは! ") + sorted(real_tok.special_token_ids)[:1]
    pieces, tail = _stream(real_tok, ids, prompt=prompt)
    full = real_tok.decode(prompt + ids)
    assert "".join(pieces) + tail == full[len(real_tok.decode(prompt)):]


@pytest.fixture(scope="module")
def metaspace_tok():
    """A Llama-2 style sentencepiece BPE: metaspace, byte fallback, strip of the first space."""
    backend = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    backend.train_from_iterator(TEXTS[:1] * 20 + ["hello world again and again"] * 20, trainer)
    data = json.loads(backend.to_str())
    vocab = data["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    data["model"]["byte_fallback"] = True
    backend = tokenizers.Tokenizer.from_str(json.dumps(data))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return Tokenizer(backend, special_tokens={"bos_token": "<s>", "eos_token": "</s>"})


@pytest.mark.parametrize("text", ["hello world again", TEXTS[0], TEXTS[1], TEXTS[2]])
def test_metaspace_spacing_and_byte_fallback(metaspace_tok, text):
    ids = metaspace_tok.encode(text)
    pieces, full = _check_stream(metaspace_tok, ids)
    assert full == text
    assert all("\ufffd" not in p for p in pieces)
    if text.startswith("hello"):
        assert [p for p in pieces if p][1].startswith(" ")

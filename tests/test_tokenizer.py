"""Tokenizer loading: real qwen3 / llama-3 files and synthetic directories for the config rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizers
from tokenizers import models, pre_tokenizers

from atlas_core.testing.fixtures import real_models_dir
from atlas_core.tokenizer import ChatTemplateError, Tokenizer

FIXTURES = real_models_dir()
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason="real-model fixtures not present")
HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def qwen3():
    return Tokenizer.from_dir(FIXTURES / "qwen3")


@pytest.fixture(scope="module")
def llama3():
    return Tokenizer.from_dir(FIXTURES / "llama-3")


def _vectors(folder: str, name: str) -> list[tuple[str, list[int]]]:
    base = FIXTURES / folder / f"ggml-vocab-{name}.gguf"
    texts = Path(f"{base}.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    ids = Path(f"{base}.out").read_text(encoding="utf-8").split("\n")
    return [(t, [int(x) for x in i.split()]) for t, i in zip(texts[:-1], ids[:-1])]


@needs_fixtures
def test_qwen3_loads(qwen3):
    assert qwen3.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    assert qwen3.eos_token_ids == {151645, 151643}
    assert (qwen3.bos_token_id, qwen3.pad_token_id, qwen3.vocab_size) == (None, 151643, 151669)
    assert qwen3.token_to_id("<think>") == 151667 and qwen3.id_to_token(151667) == "<think>"
    assert qwen3.add_bos_token is False and "enable_thinking" in qwen3.chat_template


@needs_fixtures
@pytest.mark.parametrize("folder,name,fixture", [("qwen3", "qwen2", "qwen3"), ("llama-3", "llama-bpe", "llama3")])
def test_encode_matches_llama_cpp_vectors(folder, name, fixture, request):
    tok = request.getfixturevalue(fixture)
    vectors = _vectors(folder, name)
    assert len(vectors) > 40
    for text, ids in vectors:
        assert tok.encode(text) == ids, text


@needs_fixtures
def test_llama3_special_tokens(llama3):
    assert llama3.bos_token_id == 128000
    assert llama3.eos_token_ids == {128001, 128008, 128009}
    assert llama3.encode("hi", add_special_tokens=True)[0] == 128000
    ids = llama3.encode("<|begin_of_text|>Hello<|eot_id|>")
    assert llama3.decode(ids) == "Hello"
    assert llama3.decode(ids, skip_special_tokens=False) == "<|begin_of_text|>Hello<|eot_id|>"


def _tiny_dir(path: Path, config: dict | None = None, **files: str) -> Path:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, "hi": 4}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(["<s>", "</s>", "<pad>"])
    path.mkdir(parents=True, exist_ok=True)
    backend.save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    for name, text in files.items():
        target = path / name.replace("__", "/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return path


def test_added_token_dict_forms_and_eos_merge(tmp_path):
    config = {"bos_token": {"__type": "AddedToken", "content": "<s>", "special": True},
              "eos_token": {"content": "</s>"}, "pad_token": "<pad>", "unk_token": None,
              "image_token": "<img>", "extra_special_tokens": {"audio_token": "<aud>"},
              "chat_template": "{{ bos_token }}|{{ eos_token }}|{{ image_token }}|{{ audio_token }}"}
    path = _tiny_dir(tmp_path, config, **{"generation_config.json": '{"eos_token_id": [2, 3]}',
                                           "config.json": '{"text_config": {"eos_token_id": 0}}'})
    tok = Tokenizer.from_dir(path)
    assert (tok.bos_token_id, tok.pad_token_id) == (1, 3)
    assert tok.eos_token_ids == {0, 2, 3}
    assert tok.apply_chat_template(HELLO) == "<s>|</s>|<img>|<aud>"


def test_special_tokens_map_file_used_without_added_tokens_decoder(tmp_path):
    path = _tiny_dir(tmp_path, {"chat_template": "{{ bos_token }}"},
                     **{"special_tokens_map.json": '{"bos_token": {"content": "<s>", "lstrip": false}}'})
    assert Tokenizer.from_dir(path).apply_chat_template(HELLO) == "<s>"


def test_template_file_precedence(tmp_path):
    config = {"chat_template": "config"}
    assert Tokenizer.from_dir(_tiny_dir(tmp_path / "a", config)).apply_chat_template(HELLO) == "config"
    tok = Tokenizer.from_dir(_tiny_dir(tmp_path / "b", config, **{"chat_template.json": '{"chat_template": "json"}'}))
    assert tok.apply_chat_template(HELLO) == "json"
    tok = Tokenizer.from_dir(_tiny_dir(tmp_path / "c", config, **{"chat_template.jinja": "jinja",
                                                                   "chat_template.json": '{"chat_template": "j"}'}))
    assert tok.apply_chat_template(HELLO) == "jinja"
    tok = Tokenizer.from_dir(_tiny_dir(tmp_path / "d", config, **{
        "chat_template.jinja": "jinja", "additional_chat_templates__tool_use.jinja": "tools"}))
    assert set(tok.chat_templates) == {"default", "tool_use"}
    assert tok.apply_chat_template(HELLO, tools=[]) == "tools"
    assert tok.apply_chat_template(HELLO) == "jinja"


def test_named_template_list(tmp_path):
    config = {"chat_template": [{"name": "default", "template": "D"}, {"name": "rag", "template": "R"}]}
    tok = Tokenizer.from_dir(_tiny_dir(tmp_path, config))
    assert tok.chat_template == "D"
    assert tok.apply_chat_template(HELLO, template_name="rag") == "R"
    with pytest.raises(ChatTemplateError, match="no chat template named 'nope'.*rag"):
        tok.apply_chat_template(HELLO, template_name="nope")


def test_no_template_is_a_clear_error(tmp_path):
    tok = Tokenizer.from_dir(_tiny_dir(tmp_path, {}))
    assert tok.chat_template is None
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        tok.apply_chat_template(HELLO)


def test_missing_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Tokenizer.from_dir(tmp_path / "absent")
    (tmp_path / "vocab.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"no tokenizer.json .*found only vocab.json.*save_pretrained"):
        Tokenizer.from_dir(tmp_path)


def test_bad_config_json_is_a_clear_error(tmp_path):
    path = _tiny_dir(tmp_path)
    (path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer_config.json is not valid JSON"):
        Tokenizer.from_dir(path)

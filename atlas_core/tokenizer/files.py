"""Reading a Hugging Face tokenizer directory: special tokens, chat templates, eos ids.

Follows what transformers 5 does when it loads a fast tokenizer from a local directory, so
that the special tokens a chat template sees and the template it picks are the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                        "cls_token", "mask_token")
_OTHER_TOKENIZER_FILES = ("tokenizer.model", "vocab.json", "tekken.json", "tiktoken.model",
                          "spiece.model", "vocab.txt")


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object; a missing file reads as ``{}``.

    Raises:
        ValueError: the file exists but is not a JSON object.
    """
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); re-download it from the model repository") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} should hold a JSON object; re-download it from the model repository")
    return data


def find_tokenizer_json(path: Path) -> Path:
    """The ``tokenizer.json`` of a model directory.

    Raises:
        FileNotFoundError: the directory or its tokenizer.json is missing, saying how to fix it.
    """
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist; pass a local model directory")
    file = path / "tokenizer.json"
    if file.is_file():
        return file
    others = [name for name in _OTHER_TOKENIZER_FILES if (path / name).is_file()]
    found = f" (found only {', '.join(others)})" if others else ""
    raise FileNotFoundError(
        f"no tokenizer.json in {path}{found}: Atlas needs the fast-tokenizer file; download it from "
        "the model repository, or convert once with transformers: "
        "AutoTokenizer.from_pretrained(path).save_pretrained(path)")


def token_content(value: Any) -> str | None:
    """A special token's text, from a plain string or an AddedToken dict (``{"content": ...}``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def read_special_tokens(path: Path, config: dict[str, Any]) -> dict[str, str]:
    """Special tokens a chat template sees, as transformers' ``special_tokens_map`` holds them.

    The named tokens (``bos_token`` ... ``mask_token``) come from tokenizer_config.json, or from
    special_tokens_map.json when the config has no ``added_tokens_decoder`` (transformers' legacy
    path); model-specific ``*_token`` strings and an ``extra_special_tokens`` mapping join them.
    """
    values = dict(config)
    if "added_tokens_decoder" not in config:
        values.update(read_json(path / "special_tokens_map.json"))
    tokens = {}
    for key in NAMED_SPECIAL_TOKENS:
        content = token_content(values.get(key))
        if content is not None:
            tokens[key] = content
    for key, value in config.items():
        if key.endswith("_token") and key not in NAMED_SPECIAL_TOKENS and isinstance(value, str):
            tokens[key] = value
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):
        tokens.update({k: v for k, v in extra.items() if isinstance(v, str)})
    return tokens


def _named_templates(value: Any) -> str | dict[str, str] | None:
    if isinstance(value, (list, tuple)):
        return {item["name"]: item["template"] for item in value}
    return value if isinstance(value, (str, dict)) else None


def read_chat_templates(path: Path, config: dict[str, Any]) -> dict[str, str]:
    """Chat templates by name (``"default"`` for the main one).

    Precedence as in transformers: chat_template.jinja and additional_chat_templates/*.jinja
    replace the templates of tokenizer_config.json; chat_template.json (the processor file of
    multimodal models) is used when no .jinja file exists.
    """
    templates = {}
    if (path / "chat_template.jinja").is_file():
        templates["default"] = (path / "chat_template.jinja").read_text(encoding="utf-8")
    extra_dir = path / "additional_chat_templates"
    if extra_dir.is_dir():
        for file in sorted(extra_dir.glob("*.jinja")):
            templates[file.name.removesuffix(".jinja")] = file.read_text(encoding="utf-8")
    if templates:
        return templates
    found = _named_templates(read_json(path / "chat_template.json").get("chat_template"))
    if found is None:
        found = _named_templates(config.get("chat_template"))
    if isinstance(found, str):
        return {"default": found}
    return dict(found or {})


def _ids(value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def read_model_token_ids(path: Path, key: str) -> list[int]:
    """Token ids named ``key`` (e.g. ``eos_token_id``) in generation_config.json and config.json."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        data = read_json(path / name)
        ids += _ids(data.get(key))
        if isinstance(data.get("text_config"), dict):
            ids += _ids(data["text_config"].get(key))
    return ids

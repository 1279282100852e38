"""`Tokenizer`: a Hugging Face fast tokenizer plus its special tokens and chat templates."""

from __future__ import annotations

import threading
from functools import cached_property
from pathlib import Path
from typing import Any

import tokenizers

from atlas_core.tokenizer import files
from atlas_core.tokenizer.chat_template import ChatTemplateError, render_chat_template

#: Texts at least this long are encoded on a helper thread that a shutdown can abandon.
OFF_THREAD_CHARS = 1 << 16
#: Slack on the characters-per-token bound for normalizers that merge characters (NFC).
CHARS_BOUND_SLACK = 2


class PromptTooLong(ValueError):
    """A text that cannot fit the model's context, found without tokenizing it."""


class EncodeCancelled(RuntimeError):
    """A long encode abandoned by :meth:`Tokenizer.cancel_encodes` (server shutdown)."""


class Tokenizer:
    """Encode, decode and render chat prompts for one model.

    Built with `Tokenizer.from_dir`; wraps a ``tokenizers.Tokenizer``. Encoding follows the
    tokenizer.json post-processor (as transformers 5 does, ``add_bos_token`` in the config is
    informational only); decoding does no ``clean_up_tokenization_spaces`` rewriting, so streamed
    text and the full decode always agree.

    Attributes:
        special_tokens: template-visible special tokens, e.g. ``{"eos_token": "<|im_end|>"}``.
        chat_templates: chat templates by name; ``"default"`` is the main one.
        eos_token_ids: every id that ends generation (tokenizer eos plus generation_config /
            config.json ``eos_token_id``).
        bos_token_id, pad_token_id: ids of those tokens, or None.
        add_bos_token: the config's ``add_bos_token`` (None when absent).
    """

    def __init__(self, backend: tokenizers.Tokenizer, *, special_tokens: dict[str, str] | None = None,
                 chat_templates: dict[str, str] | None = None, eos_token_ids: set[int] | None = None,
                 add_bos_token: bool | None = None, name_or_path: str = "") -> None:
        self.backend = backend
        self.special_tokens = dict(special_tokens or {})
        self.chat_templates = dict(chat_templates or {})
        self.add_bos_token = add_bos_token
        self.name_or_path = name_or_path
        self.bos_token_id = self._special_id("bos_token")
        self.pad_token_id = self._special_id("pad_token")
        eos = set(eos_token_ids or ())
        if self._special_id("eos_token") is not None:
            eos.add(self._special_id("eos_token"))
        self.eos_token_ids: set[int] = eos
        self.special_token_ids: frozenset[int] = frozenset(
            i for i, tok in backend.get_added_tokens_decoder().items() if tok.special)
        self.max_input_tokens: int | None = None
        self._in_flight: set[threading.Event] = set()

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load tokenizer.json, tokenizer_config.json and chat templates from a model directory.

        Raises:
            FileNotFoundError: the directory or its tokenizer.json is missing.
            ValueError: a config file is not valid JSON.
        """
        path = Path(path)
        backend = tokenizers.Tokenizer.from_file(str(files.find_tokenizer_json(path)))
        config = files.read_json(path / "tokenizer_config.json")
        tok = cls(backend, special_tokens=files.read_special_tokens(path, config),
                  chat_templates=files.read_chat_templates(path, config),
                  eos_token_ids=set(files.read_model_token_ids(path, "eos_token_id")),
                  add_bos_token=config.get("add_bos_token"), name_or_path=str(path))
        if tok.pad_token_id is None:
            pads = files.read_model_token_ids(path, "pad_token_id")
            tok.pad_token_id = pads[0] if pads else None
        return tok

    def _special_id(self, key: str) -> int | None:
        token = self.special_tokens.get(key)
        return None if token is None else self.backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def chat_template(self) -> str | None:
        """The template used when none is named: ``"default"``, or the only one there is."""
        if "default" in self.chat_templates:
            return self.chat_templates["default"]
        if len(self.chat_templates) == 1:
            return next(iter(self.chat_templates.values()))
        return None

    @cached_property
    def max_chars_per_token(self) -> int | None:
        """The most characters one token can stand for (None: no bound, e.g. a fused unknown)."""
        model = self.backend.model
        kind = type(model).__name__
        if kind in ("WordLevel", "Unigram") or (kind == "BPE" and model.unk_token
                                                 and model.fuse_unk):
            return None
        longest = max((len(t) for t in self.backend.get_vocab(with_added_tokens=True)), default=1)
        if kind == "WordPiece":
            longest = max(longest, model.max_input_chars_per_word)
        return longest

    @property
    def max_input_chars(self) -> int | None:
        """Characters beyond which a text cannot fit ``max_input_tokens`` (None: no limit)."""
        if self.max_input_tokens is None or self.max_chars_per_token is None:
            return None
        return self.max_input_tokens * self.max_chars_per_token * CHARS_BOUND_SLACK

    def limit_input(self, max_tokens: int | None) -> None:
        """Make :meth:`encode` refuse texts that cannot fit ``max_tokens`` before tokenizing."""
        self.max_input_tokens = max_tokens
        if max_tokens is not None:
            self.max_chars_per_token  # noqa: B018 - computed now, not in the first request

    def check_input_size(self, num_chars: int) -> None:
        """Raise :class:`PromptTooLong` when a text of ``num_chars`` characters cannot fit
        ``max_input_tokens``."""
        limit = self.max_input_chars
        if limit is not None and num_chars > limit:
            raise PromptTooLong(
                f"the prompt has {num_chars:,} characters, and no text of more than {limit:,} "
                f"characters fits this model's context of {self.max_input_tokens:,} tokens")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` applies the post-processor (e.g. BOS).

        Raises:
            PromptTooLong: ``text`` cannot fit ``max_input_tokens`` (see :meth:`limit_input`).
            EncodeCancelled: :meth:`cancel_encodes` was called while a long text was encoded.
        """
        self.check_input_size(len(text))
        if len(text) < OFF_THREAD_CHARS:
            return self._encode_releasing_gil(text, add_special_tokens)
        return self._encode_abandonable(text, add_special_tokens)

    def _encode_releasing_gil(self, text: str, add_special_tokens: bool) -> list[int]:
        # ``tokenizers`` holds the GIL in ``encode`` (a long text freezes every other thread,
        # the event loop included) but releases it in the batch calls.
        batch = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return batch([text], add_special_tokens=add_special_tokens)[0].ids

    def _encode_abandonable(self, text: str, add_special_tokens: bool) -> list[int]:
        # The Rust encoder cannot be interrupted: a daemon thread runs it so that a shutdown
        # neither waits for it nor blocks the caller.
        result: list = []
        done, cancel = threading.Event(), threading.Event()

        def work() -> None:
            try:
                result.append(self._encode_releasing_gil(text, add_special_tokens))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                result.append(exc)
            finally:
                done.set()

        threading.Thread(target=work, daemon=True, name="atlas-encode").start()
        self._in_flight.add(cancel)
        try:
            while not done.wait(0.05):
                if cancel.is_set():
                    raise EncodeCancelled("the encode was cancelled (server shutdown)")
        finally:
            self._in_flight.discard(cancel)
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def cancel_encodes(self) -> None:
        """Make every long encode in progress raise :class:`EncodeCancelled` now (server
        shutdown); later encodes run as usual."""
        for cancel in list(self._in_flight):
            cancel.set()

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; special added tokens are dropped when ``skip_special_tokens``."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of ``token_id`` (None when out of range)."""
        return self.backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        """The id of vocabulary string ``token`` (None when unknown)."""
        return self.backend.token_to_id(token)

    def select_chat_template(self, template_name: str | None = None, has_tools: bool = False) -> str:
        """The template to render, chosen as transformers does.

        A named template when ``template_name`` is given; otherwise ``"tool_use"`` when tools are
        offered and such a template exists, else ``"default"``.

        Raises:
            ChatTemplateError: there is no template, or no template of that name.
        """
        names = sorted(self.chat_templates)
        if template_name is not None:
            if template_name not in self.chat_templates:
                raise ChatTemplateError(
                    f"no chat template named {template_name!r} in {self.name_or_path or 'this tokenizer'}; "
                    f"available: {names}")
            return self.chat_templates[template_name]
        if has_tools and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        if self.chat_template is not None:
            return self.chat_template
        if not self.chat_templates:
            raise ChatTemplateError(
                f"{self.name_or_path or 'this tokenizer'} has no chat template: add chat_template.jinja "
                "to the model directory or use the plain completions API")
        raise ChatTemplateError(f"several chat templates and none is 'default': name one of {names}")

    def apply_chat_template(self, messages: list[dict[str, Any]], *, tools: list[dict] | None = None,
                            documents: list[dict] | None = None, add_generation_prompt: bool = True,
                            template_name: str | None = None, **template_kwargs: Any) -> str:
        """Render a conversation to prompt text, byte-identical to transformers.

        Args:
            messages: OpenAI-style messages (``role``, ``content``, ``tool_calls``,
                ``reasoning_content``, ...).
            tools: tool JSON schemas, passed to the template as given.
            documents: retrieval documents for templates that read them.
            add_generation_prompt: end with the header that opens the assistant turn.
            template_name: pick a named template (``"tool_use"``, ...).
            **template_kwargs: extra template variables such as ``enable_thinking``; they
                override special tokens of the same name.

        Raises:
            ChatTemplateError: no template, or the template rejected the conversation.
        """
        source = self.select_chat_template(template_name, has_tools=tools is not None)
        variables = {**self.special_tokens, **template_kwargs}
        return render_chat_template(source, messages, tools=tools, documents=documents,
                                    add_generation_prompt=add_generation_prompt, **variables)

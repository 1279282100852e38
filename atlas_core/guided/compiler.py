"""`GrammarCompiler`: guided-decoding constraints -> llguidance grammars -> per-request matchers.

llguidance reads the model's ``tokenizer.json`` directly (no torch, no transformers). Its
tokenizer is built once per (tokenizer, vocab size) and shared; compiled grammars are cached
per constraint, so a repeated schema costs only a matcher construction (~1 ms).
"""

from __future__ import annotations

import re
import threading
import weakref
from collections import OrderedDict

from atlas_core.guided.matcher import GuidedMatcher
from atlas_core.guided.params import GuidedDecodingError, GuidedDecodingParams
from atlas_core.guided.tool_grammar import JSON_OPTIONS, closed_parameters, tool_call_lark

#: Compiled grammars kept per compiler.
GRAMMAR_CACHE_SIZE = 256

_ll_tokenizers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_ll_lock = threading.Lock()


def ll_tokenizer(tokenizer, vocab_size: int | None = None):
    """The ``llguidance.LLTokenizer`` of ``tokenizer`` (cached; ~1 s for a 150k vocabulary).

    Args:
        tokenizer: an :class:`atlas_core.tokenizer.Tokenizer`.
        vocab_size: the model's logits width (default: the tokenizer's); ids the tokenizer
            lacks are never allowed.
    """
    import llguidance
    vocab_size = vocab_size or tokenizer.vocab_size
    if vocab_size < tokenizer.vocab_size:
        raise ValueError(f"guided decoding needs the model's vocab_size ({vocab_size}) to cover the "
                         f"tokenizer's {tokenizer.vocab_size} tokens")
    with _ll_lock:
        per_tokenizer = _ll_tokenizers.setdefault(tokenizer, {})
        if vocab_size not in per_tokenizer:
            eos = sorted(tokenizer.eos_token_ids) or None
            per_tokenizer[vocab_size] = _new_ll_tokenizer(
                llguidance, tokenizer.backend.to_str(), vocab_size, eos)
        return per_tokenizer[vocab_size]


def _new_ll_tokenizer(llguidance, tokenizer_json: str, vocab_size: int, eos: list[int] | None):
    try:
        return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos)
    except TypeError:
        if not eos:
            raise
    # Older llguidance takes one EOS id; GuidedMatcher allows the others wherever it may end.
    return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos[0])


def grammar_eos_ids(ll_tok) -> set[int]:
    """The EOS ids an ``LLTokenizer`` ends grammars with (one id on older llguidance)."""
    many = getattr(ll_tok, "eos_tokens", None)
    return set(many) if many else {ll_tok.eos_token}


def as_lark(grammar: str) -> str:
    """``grammar`` in llguidance's Lark dialect; GBNF (llama.cpp ``root ::= ...``, what vLLM
    clients send) is converted.

    Raises:
        GuidedDecodingError: GBNF that cannot be converted.
    """
    if "::=" not in grammar or re.search(r"(?m)^\s*(%llguidance\b|start\s*:)", grammar):
        return grammar
    from llguidance.gbnf_to_lark import gbnf_to_lark
    try:
        return gbnf_to_lark(grammar)
    except Exception as exc:  # noqa: BLE001 - the converter raises bare exceptions on bad input
        raise GuidedDecodingError(f"invalid GBNF grammar: {_one_line(str(exc))}") from None


def _one_line(message: str) -> str:
    return " ".join(message.split())


class GrammarCompiler:
    """Builds matchers for one model's tokenizer. Thread-safe.

    Args:
        tokenizer: the model's :class:`atlas_core.tokenizer.Tokenizer`.
        vocab_size: the model's logits width (default: the tokenizer's).
    """

    def __init__(self, tokenizer, vocab_size: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size or tokenizer.vocab_size
        self._ll_tokenizer = None
        self._grammars: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def ll_tokenizer(self):
        if self._ll_tokenizer is None:
            self._ll_tokenizer = ll_tokenizer(self.tokenizer, self.vocab_size)
        return self._ll_tokenizer

    def grammar(self, params: GuidedDecodingParams) -> str:
        """The validated llguidance grammar (JSON text) of ``params``.

        Raises:
            GuidedDecodingError: the schema, regex or grammar is invalid (one line, what failed).
        """
        with self._lock:
            if params.key in self._grammars:
                self._grammars.move_to_end(params.key)
                return self._grammars[params.key]
        grammar = self._build(params)
        self._validate(grammar, _describe(params))
        with self._lock:
            self._grammars[params.key] = grammar
            while len(self._grammars) > GRAMMAR_CACHE_SIZE:
                self._grammars.popitem(last=False)
        return grammar

    def check(self, params: GuidedDecodingParams) -> None:
        """Raise :class:`GuidedDecodingError` when ``params`` cannot be compiled."""
        self.grammar(params)

    def matcher(self, params: GuidedDecodingParams) -> GuidedMatcher:
        """A fresh matcher at the start of ``params``' grammar (one per generated sequence)."""
        import llguidance
        m = llguidance.LLMatcher(self.ll_tokenizer, self.grammar(params), log_level=0)
        if m.is_error():
            raise GuidedDecodingError(f"{_describe(params)} cannot be used: {_one_line(m.get_error())}")
        known = grammar_eos_ids(self.ll_tokenizer)
        aliases = tuple(sorted(set(self.tokenizer.eos_token_ids) - known))
        return GuidedMatcher(m, self.vocab_size, eos_aliases=aliases,
                             eos_token=self.ll_tokenizer.eos_token)

    def _build(self, params: GuidedDecodingParams) -> str:
        from llguidance import LLMatcher
        try:
            if params.kind == "json_schema":
                return LLMatcher.grammar_from_json_schema(params.spec, defaults=JSON_OPTIONS)
            if params.kind == "json_object":
                return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
            if params.kind == "regex":
                return LLMatcher.grammar_from_regex(params.spec)
            if params.kind == "grammar":
                return LLMatcher.grammar_from_lark(as_lark(params.spec))
        except (ValueError, TypeError) as e:
            raise GuidedDecodingError(f"invalid {_describe(params)}: {_one_line(str(e))}") from None
        for tool in params.spec.tools:
            schema = LLMatcher.grammar_from_json_schema(closed_parameters(tool["parameters"]),
                                                        defaults=JSON_OPTIONS)
            self._validate(schema, f"parameters schema of tool {tool['name']!r}")
        return LLMatcher.grammar_from_lark(tool_call_lark(params.spec, self._special_token_id))

    def _validate(self, grammar: str, what: str) -> None:
        from llguidance import LLMatcher
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, self.ll_tokenizer)
        if is_error:
            raise GuidedDecodingError(f"invalid {what}: {_one_line(messages[0])}")

    def _special_token_id(self, text: str) -> int | None:
        tid = self.tokenizer.token_to_id(text)
        if tid is not None and self.ll_tokenizer.is_special_token(tid):
            return tid
        return None


def _describe(params: GuidedDecodingParams) -> str:
    return {"json_schema": "JSON schema", "json_object": "JSON object constraint",
            "regex": "regex", "grammar": "Lark grammar",
            "tool_call": f"{getattr(params.spec, 'format', '')} tool-call grammar"}[params.kind]

"""SamplingParams: how one request is decoded, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from atlas_core.engine.agent_guards import AgentGuardParams
from atlas_core.guided.params import GuidedDecodingParams

#: The most top logprobs a request may ask for per token.
MAX_LOGPROBS = 20
#: The most completions one request may ask for.
MAX_N = 128
#: Ceiling of every count (tokens, top_k): the device keeps them as int32.
MAX_COUNT = 2 ** 31 - 1


def _check(ok: bool, name: str, allowed: str, value) -> None:
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def _is_int(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_real(value, low: float, high: float) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and low <= value <= high)


#: text-generation-webui's default DRY sequence breakers.
DEFAULT_DRY_BREAKERS = ("\n", ":", "\"", "*")
#: Most DRY sequence breakers one request may give.
MAX_DRY_BREAKERS = 64

#: What ``top_p=0`` becomes: a nucleus holding only the most likely token.
TOP_P_MIN = 1e-6


@dataclass
class SamplingParams:
    """Decoding settings of one request (vLLM / OpenAI names and semantics).

    Attributes:
        n: completions to generate from the prompt (each with its own random stream).
        max_tokens: most tokens to generate per completion; ``None`` means up to the context limit.
        min_tokens: tokens generated before EOS, stop token ids or stop strings may end it.
        temperature: softmax temperature; ``0`` is greedy.
        top_p, top_k, min_p: nucleus / top-k (``0`` or ``-1`` disables) / min-p filters.
        repetition_penalty, presence_penalty, frequency_penalty: HF / OpenAI penalties.
        logit_bias: token id -> value added to its logit every step.
        seed: seed of this request's random stream (default: a random one per request).
        stop: strings that end generation (trimmed from the text unless
            ``include_stop_str_in_output``); they may span token boundaries.
        stop_token_ids: token ids that end generation (besides EOS).
        ignore_eos: keep generating past EOS.
        logprobs: number of top logprobs to return per generated token (``0``: only the chosen).
        prompt_logprobs: number of top logprobs to return per prompt token.
        skip_special_tokens: leave special tokens out of the text.
        include_stop_str_in_output: keep the matched stop string (or stop token text).
        thinking_budget: most tokens generated inside a think block; when it is spent the
            engine forces ``thinking_end_token_ids`` and generation goes on with the answer
            (``None``: no limit). See :mod:`atlas_core.engine.thinking`.
        thinking_start_token_ids: tokens that open a think block when generated first;
            empty means the prompt already opened it (output starts inside the block).
        thinking_end_token_ids: the tokens that end a think block, e.g. the ids of
            ``"</think>\n\n"``; the first one closing the block is what the engine watches for.
        dry_multiplier, dry_base, dry_allowed_length: DRY repetition penalty
            (text-generation-webui / llama.cpp names; ``dry_multiplier=0`` is off): a token
            extending a repeat of ``L >= dry_allowed_length`` tokens loses
            ``dry_multiplier * dry_base ** (L - dry_allowed_length)`` from its logit.
        dry_sequence_breakers: strings whose tokens end a repeat match (default
            ``["\\n", ":", "\"", "*"]``); the engine's tokenizer turns each into its last token.
        dry_sequence_breaker_ids: breaker token ids given directly (used as well).
        xtc_threshold, xtc_probability: XTC, exclude top choices (``xtc_probability=0`` is
            off): with that probability per token, every candidate at or above the threshold
            but the least likely is removed.
        top_n_sigma: keep tokens within ``n`` standard deviations of the top logit (``0`` or
            ``-1`` is off).
        agent_guards: loop guards of a tool-using request
            (:class:`~atlas_core.engine.agent_guards.AgentGuardParams`; the server sets them).
        priority: scheduling priority under ``--scheduling-policy slo`` (vLLM's field: lower
            values are served first; default 0).
        guided: constrain the output to a JSON schema, regex, grammar or tool call
            (:class:`~atlas_core.guided.GuidedDecodingParams`); the sequence stops (``"stop"``)
            when the constraint is complete.
        speculative: let the engine draft and verify tokens ahead for this request when
            speculative decoding is on (``False`` opts out; the output is the same either way).

    Raises:
        ValueError: naming the field and its allowed range.
    """

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    thinking_budget: int | None = None
    thinking_start_token_ids: list[int] | None = None
    thinking_end_token_ids: list[int] | None = None
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_sequence_breakers: list[str] | None = None
    dry_sequence_breaker_ids: list[int] | None = None
    xtc_threshold: float = 0.1
    xtc_probability: float = 0.0
    top_n_sigma: float = 0.0
    priority: int = 0
    agent_guards: AgentGuardParams | None = None
    guided: GuidedDecodingParams | None = None
    speculative: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = [int(t) for t in (self.stop_token_ids or [])]
        self.thinking_start_token_ids = [int(t) for t in (self.thinking_start_token_ids or [])]
        self.thinking_end_token_ids = [int(t) for t in (self.thinking_end_token_ids or [])]
        if self.logit_bias:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        if self.top_k == -1:
            self.top_k = 0
        if self.top_n_sigma == -1:
            self.top_n_sigma = 0.0
        if self.dry_sequence_breakers is None:
            self.dry_sequence_breakers = list(DEFAULT_DRY_BREAKERS)
        elif isinstance(self.dry_sequence_breakers, str):
            self.dry_sequence_breakers = [self.dry_sequence_breakers]
        self.dry_sequence_breaker_ids = [int(t) for t in (self.dry_sequence_breaker_ids or [])]
        self._validate()
        if self.top_p == 0.0:
            self.top_p = TOP_P_MIN  # OpenAI accepts 0: keep only the most likely token

    def _validate(self) -> None:
        _check(_is_int(self.n, 1, MAX_N), "n", f"an integer in [1, {MAX_N}]", self.n)
        _check(self.max_tokens is None or _is_int(self.max_tokens, 1, MAX_COUNT), "max_tokens",
               f"an integer in [1, {MAX_COUNT}] (or None)", self.max_tokens)
        _check(_is_int(self.min_tokens, 0, MAX_COUNT), "min_tokens",
               f"an integer in [0, {MAX_COUNT}]", self.min_tokens)
        if self.max_tokens is not None:
            _check(self.min_tokens <= self.max_tokens, "min_tokens",
                   f"<= max_tokens ({self.max_tokens})", self.min_tokens)
        _check(_is_real(self.temperature, 0.0, 100.0), "temperature", "a number in [0, 100]",
               self.temperature)
        _check(_is_real(self.top_p, 0.0, 1.0), "top_p", "a number in [0, 1]", self.top_p)
        _check(_is_int(self.top_k, 0, MAX_COUNT), "top_k",
               "-1 or 0 (off) or an integer >= 1 (at most the vocabulary size)", self.top_k)
        _check(_is_real(self.min_p, 0.0, 1.0), "min_p", "a number in [0, 1]", self.min_p)
        _check(_is_real(self.repetition_penalty, 0.0, 10.0) and self.repetition_penalty > 0,
               "repetition_penalty", "a number in (0, 10]", self.repetition_penalty)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_is_real(value, -2.0, 2.0), name, "a number in [-2, 2]", value)
        for tok, bias in (self.logit_bias or {}).items():
            _check(_is_int(tok, 0, MAX_COUNT), "logit_bias", "keyed by token ids >= 0", tok)
            _check(_is_real(bias, -100.0, 100.0), "logit_bias", "values in [-100, 100]", bias)
        _check(self.seed is None or _is_int(self.seed, 0, 2 ** 64 - 1), "seed",
               "an integer in [0, 2**64)", self.seed)
        for s in self.stop:
            _check(isinstance(s, str) and s != "", "stop", "a list of non-empty strings", s)
        for name in ("stop_token_ids", "thinking_start_token_ids", "thinking_end_token_ids"):
            for t in getattr(self, name):
                _check(_is_int(t, 0, MAX_COUNT), name,
                       "token ids >= 0 (below the vocabulary size)", t)
        _check(self.thinking_budget is None or _is_int(self.thinking_budget, 0, MAX_COUNT),
               "thinking_budget", f"an integer in [0, {MAX_COUNT}] (or None)", self.thinking_budget)
        _check(self.thinking_budget is None or bool(self.thinking_end_token_ids),
               "thinking_end_token_ids", "set when thinking_budget is", self.thinking_end_token_ids)
        self._validate_filters()
        _check(self.guided is None or isinstance(self.guided, GuidedDecodingParams), "guided",
               "a GuidedDecodingParams (or None)", self.guided)
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            _check(v is None or _is_int(v, 0, MAX_LOGPROBS), name,
                   f"an integer in [0, {MAX_LOGPROBS}] (or None)", v)
        _check(isinstance(self.speculative, bool), "speculative", "true or false",
               self.speculative)

    def _validate_filters(self) -> None:
        _check(_is_real(self.dry_multiplier, 0.0, 100.0), "dry_multiplier",
               "a number in [0, 100] (0: off)", self.dry_multiplier)
        _check(_is_real(self.dry_base, 1.0, 100.0) and self.dry_base > 1.0, "dry_base",
               "a number in (1, 100]", self.dry_base)
        _check(_is_int(self.dry_allowed_length, 1, 10_000), "dry_allowed_length",
               "an integer in [1, 10000]", self.dry_allowed_length)
        breakers = self.dry_sequence_breakers
        _check(isinstance(breakers, list) and len(breakers) <= MAX_DRY_BREAKERS
               and all(isinstance(b, str) and b for b in breakers), "dry_sequence_breakers",
               f"a list of at most {MAX_DRY_BREAKERS} non-empty strings", breakers)
        for t in self.dry_sequence_breaker_ids:
            _check(_is_int(t, 0, MAX_COUNT), "dry_sequence_breaker_ids", "token ids >= 0", t)
        _check(_is_real(self.xtc_threshold, 0.0, 1.0), "xtc_threshold",
               "a number in [0, 1] (above 0.5 it never acts)", self.xtc_threshold)
        _check(_is_real(self.xtc_probability, 0.0, 1.0), "xtc_probability",
               "a number in [0, 1] (0: off)", self.xtc_probability)
        _check(_is_int(self.priority, -(2 ** 31), 2 ** 31 - 1), "priority",
               "an integer in [-2**31, 2**31) (lower is served first)", self.priority)
        _check(_is_real(self.top_n_sigma, 0.0, 100.0), "top_n_sigma",
               "a number in [0, 100] (0 or -1: off)", self.top_n_sigma)

    @property
    def has_logits_filters(self) -> bool:
        """Whether DRY, XTC or top-n-sigma acts on this request's logits."""
        return (self.dry_multiplier > 0 or self.top_n_sigma > 0
                or (self.xtc_probability > 0 and self.xtc_threshold <= 0.5))

    @property
    def is_greedy(self) -> bool:
        """Whether tokens are chosen by argmax."""
        return self.temperature <= 1e-5

    @property
    def has_penalties(self) -> bool:
        """Whether any repetition / presence / frequency penalty is active."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    def validate_vocab(self, vocab_size: int) -> None:
        """Raise ``ValueError`` when a token id named here is outside ``[0, vocab_size)`` or
        ``top_k`` is larger than the vocabulary."""
        _check(self.top_k <= vocab_size, "top_k",
               f"-1 or 0 (off) or an integer in [1, {vocab_size}] (this model's vocabulary size)",
               self.top_k)
        for name, ids in (("logit_bias", list(self.logit_bias or {})),
                          ("stop_token_ids", self.stop_token_ids),
                          ("thinking_start_token_ids", self.thinking_start_token_ids),
                          ("thinking_end_token_ids", self.thinking_end_token_ids)):
            bad = [t for t in ids if t >= vocab_size]
            _check(not bad, name, f"token ids in [0, {vocab_size})", bad[:3])

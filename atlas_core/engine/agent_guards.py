"""Agent-loop guards: stop a tool-using generation that is looping instead of burning tokens.

The server attaches :class:`AgentGuardParams` to requests that offer tools (with the request's
tool-call and reasoning parsers); the engine runs :class:`AgentGuards` after every token on the
sequence's text. A tripped guard ends the sequence with ``finish_reason="stop"`` and
``stop_reason="agent_guard:<name>"``:

* ``repeated_tool_call``: the same call (name and arguments, whitespace-insensitive JSON) was
  completed ``max_identical_tool_calls`` times in this response;
* ``max_tool_calls``: ``max_tool_calls`` calls were completed;
* ``reasoning_loop``: over the last ``LOOP_WINDOW`` words of reasoning, fewer than
  ``LOOP_MIN_DISTINCT`` of the word ``LOOP_NGRAM``-grams are distinct (a paraphrase loop).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

#: Words per n-gram of the reasoning-loop guard.
LOOP_NGRAM = 4
#: Most recent reasoning words the reasoning-loop guard looks at.
LOOP_WINDOW = 240
#: Fraction of distinct n-grams below which the window counts as a loop.
LOOP_MIN_DISTINCT = 0.3
#: Guard names, as counted on ``/metrics`` and put in ``stop_reason``.
GUARD_NAMES = ("repeated_tool_call", "max_tool_calls", "reasoning_loop")


@dataclass
class AgentGuardParams:
    """The guards of one tool-using request; ``None`` fields take the engine's defaults.

    Attributes:
        tool_parser: the request's ``ToolParser`` class; tools: the offered tools.
        reasoning_parser: its ``ReasoningParser`` class (``None``: no reasoning).
        in_reasoning: the prompt opened the think block.
        max_identical_tool_calls: stop at this many identical calls (``0``: off).
        max_tool_calls: stop after this many calls (``0``: no cap).
        reasoning_loop: stop a reasoning paraphrase loop.
    """

    tool_parser: Any = None
    tools: list | None = None
    reasoning_parser: Any = None
    in_reasoning: bool = False
    max_identical_tool_calls: int | None = None
    max_tool_calls: int | None = None
    reasoning_loop: bool | None = None


def reasoning_loops(words: list[str]) -> bool:
    """Whether the last :data:`LOOP_WINDOW` words repeat their n-grams (see the module doc)."""
    if len(words) < LOOP_WINDOW:
        return False
    window = words[-LOOP_WINDOW:]
    grams = [tuple(window[i:i + LOOP_NGRAM]) for i in range(len(window) - LOOP_NGRAM + 1)]
    return len(set(grams)) < LOOP_MIN_DISTINCT * len(grams)


def call_key(name: str, arguments: str) -> tuple[str, str]:
    """A call's identity: its name and its arguments as canonical JSON (raw text if not JSON)."""
    try:
        args = json.dumps(json.loads(arguments or "{}"), sort_keys=True, separators=(",", ":"))
    except ValueError:
        args = " ".join(arguments.split())
    return name, args


class _SeqGuard:
    def __init__(self, params: AgentGuardParams) -> None:
        from atlas_core.parsers import OutputParser
        reasoning = (params.reasoning_parser(in_reasoning=params.in_reasoning)
                     if params.reasoning_parser else None)
        tools = params.tool_parser(params.tools) if params.tool_parser else None
        self.parser = OutputParser(reasoning, tools)
        self.fed = 0
        self.reasoning_words: list[str] = []
        self.calls: dict[int, list[str]] = {}
        self.done: Counter = Counter()
        self.num_done = 0


class AgentGuards:
    """Runs the guards of every guarded sequence and counts the stops.

    Args:
        max_identical_tool_calls, max_tool_calls, reasoning_loop: defaults for requests that
            leave them unset (server flags).
    """

    def __init__(self, max_identical_tool_calls: int = 3, max_tool_calls: int = 64,
                 reasoning_loop: bool = True) -> None:
        self.defaults = (max_identical_tool_calls, max_tool_calls, reasoning_loop)
        self.states: dict[int, _SeqGuard] = {}
        self.num_stops: Counter = Counter()

    def _limits(self, p: AgentGuardParams) -> tuple[int, int, bool]:
        given = (p.max_identical_tool_calls, p.max_tool_calls, p.reasoning_loop)
        return tuple(d if g is None else g for g, d in zip(given, self.defaults))

    def check(self, seq: Any) -> str | None:
        """Feed the text ``seq`` gained; the name of the guard that tripped, else ``None``."""
        params = seq.params.agent_guards
        state = self.states.get(seq.seq_id)
        if state is None:
            state = self.states[seq.seq_id] = _SeqGuard(params)
        text = seq.stop_state.text
        events = state.parser.feed(text[state.fed:])
        state.fed = len(text)
        identical, cap, loop = self._limits(params)
        for d in events.tool_calls:
            call = state.calls.setdefault(d.index, [d.name or "", ""])
            call[1] += d.arguments
            if d.done:
                state.num_done += 1
                state.done[call_key(*call)] += 1
                if identical and state.done[call_key(*call)] >= identical:
                    return self._trip(seq, "repeated_tool_call")
                if cap and state.num_done >= cap:
                    return self._trip(seq, "max_tool_calls")
        if loop and events.reasoning:
            state.reasoning_words.extend(events.reasoning.split())
            del state.reasoning_words[:-LOOP_WINDOW]
            if reasoning_loops(state.reasoning_words):
                return self._trip(seq, "reasoning_loop")
        return None

    def apply(self, seq: Any, stop_checker: Any) -> None:
        """Run :meth:`check`; a tripped guard finishes ``seq`` (``stop_reason`` names it)."""
        name = self.check(seq)
        if name is not None:
            stop_checker.finish(seq)
            seq.stop_reason = f"agent_guard:{name}"

    def _trip(self, seq: Any, name: str) -> str:
        self.num_stops[name] += 1
        self.forget(seq)
        return name

    def forget(self, seq: Any) -> None:
        """Drop a finished sequence's state."""
        self.states.pop(seq.seq_id, None)

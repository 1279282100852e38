"""Synthetic chat corpus for the demo model: arithmetic, capitals, tool calls, small talk.

Every example is a conversation whose last message is the assistant turn to learn (training) or
to predict (evaluation). Everything is drawn from a `random.Random(seed)`, so a seed gives the
same corpus on every machine. Held-out arithmetic pairs, cities and phrasings never appear in
training examples.
"""

import hashlib
import json
import random
from dataclasses import dataclass, field

import tables as T

SKILL_WEIGHTS = {
    "arith": 0.38, "capital": 0.12, "country": 0.09, "weather_call": 0.10,
    "weather_answer": 0.09, "calc_call": 0.08, "calc_answer": 0.07, "weather_notool": 0.03,
    "chat": 0.04,
}


@dataclass
class Example:
    """One conversation; `expected` holds what the evaluation checks."""

    skill: str
    messages: list
    tools: list | None = None
    enable_thinking: bool = True
    expected: dict = field(default_factory=dict)


def is_heldout_pair(a: int, b: int, op: str) -> bool:
    """True for the ~2.5% of (a, op, b) triples reserved for evaluation."""
    digest = hashlib.blake2b(f"{a}{op}{b}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % 40 == 0


def tool_def(name, description, param, param_description) -> dict:
    """An OpenAI-style function tool with one required string parameter."""
    params = {"type": "object", "properties": {param: {"type": "string",
                                                       "description": param_description}},
              "required": [param]}
    return {"type": "function",
            "function": {"name": name, "description": description, "parameters": params}}


def canonical_tools() -> list:
    """The weather and calculator tools exactly as docs/demo-model.md shows them."""
    return [tool_def("get_weather", *T.WEATHER_TOOLS[0][:1], "city", T.WEATHER_TOOLS[0][1]),
            tool_def("calculate", T.CALC_TOOLS[0][0], "expression", T.CALC_TOOLS[0][1])]


def tool_call(name: str, arguments: dict) -> dict:
    """An assistant message holding one tool call."""
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function",
                            "function": {"name": name, "arguments": arguments}}]}


class CorpusBuilder:
    """Draws examples.

    `heldout=True` draws evaluation-only numbers and cities; `paraphrase` (default: `heldout`)
    draws evaluation-only phrasings.
    """

    def __init__(self, seed: int, heldout: bool = False, paraphrase: bool | None = None):
        self.rng = random.Random(seed)
        self.heldout = heldout
        self.paraphrase = heldout if paraphrase is None else paraphrase

    # -- pieces --------------------------------------------------------------------------------
    def pick(self, train, held):
        return self.rng.choice(held if self.paraphrase else train)

    def operands(self) -> tuple[int, int, str]:
        while True:
            a, b = self._operand(0.15), self._operand(0.10)
            op = self.rng.choice("+-")
            if is_heldout_pair(a, b, op) == self.heldout:
                return a, b, op

    def _operand(self, neg_p: float) -> int:
        digits = self.rng.randint(1, 3)
        n = self.rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)
        return -n if n and self.rng.random() < neg_p else n

    def city(self) -> str:
        if self.rng.random() < 0.3:
            return self.rng.choice(T.CITIES_HELDOUT if self.heldout else T.CITIES_TRAIN)
        while True:
            name = " ".join(self._word() for _ in range(1 if self.rng.random() < 0.85 else 2))
            if (hash_bucket(name) == 0) == self.heldout:
                return name

    def _word(self) -> str:
        rng = self.rng
        word = rng.choice(T.VOWELS[:5]) if rng.random() < 0.25 else ""
        word += "".join(rng.choice(T.ONSETS) + rng.choice(T.VOWELS)
                        for _ in range(rng.randint(1, 3)))
        return (word + rng.choice(T.CODAS)).capitalize()

    def decorate(self, text: str) -> str:
        if self.heldout:
            return text
        if self.rng.random() < 0.1:
            first, _, rest = text.partition(" ")
            text = f"{first} {self.rng.choice(T.FILLERS)} {rest}".rstrip()
        text = self.rng.choice(T.PREFIXES) + text + self.rng.choice(T.SUFFIXES)
        return text.lower() if self.rng.random() < 0.05 else text

    def tools(self, weather: bool, calc: bool) -> list:
        if self.heldout:
            return [t for t in canonical_tools()
                    if (t["function"]["name"] == "get_weather" and weather)
                    or (t["function"]["name"] == "calculate" and calc)]
        out = []
        if weather:
            out.append(tool_def("get_weather", *self.rng.choice(T.WEATHER_TOOLS)[:1], "city",
                                self.rng.choice(T.WEATHER_TOOLS)[1]))
        if calc:
            desc, pdesc = self.rng.choice(T.CALC_TOOLS)
            out.append(tool_def("calculate", desc, "expression", pdesc))
        if self.rng.random() < 0.3 or not out:
            out.append(tool_def(*self.rng.choice(T.DISTRACTOR_TOOLS)))
        self.rng.shuffle(out)
        return out

    # -- skills --------------------------------------------------------------------------------
    def arith_question(self):
        a, b, op = self.operands()
        train, held = (T.ADD_TRAIN, T.ADD_HELDOUT) if op == "+" else (T.SUB_TRAIN, T.SUB_HELDOUT)
        q = self.pick(train, held).format(a=a, b=b)
        result = a + b if op == "+" else a - b
        return self.decorate(q), f"{a} {op} {b}", result

    def capital_qa(self):
        country, cap = self.rng.choice(T.CAPITALS)
        q = self.pick(T.CAPITAL_TRAIN, T.CAPITAL_HELDOUT).format(c=country, C=upper_first(country))
        return self.decorate(q), upper_first(f"the capital of {country} is {cap}") + dot(cap), cap

    def country_qa(self):
        country, cap = self.rng.choice(T.CAPITALS)
        q = self.pick(T.COUNTRY_TRAIN, T.COUNTRY_HELDOUT).format(cap=cap)
        return self.decorate(q), f"{cap} is the capital of {country}.", country

    def chat_qa(self):
        r = self.rng.random()
        if r < 0.3:
            return self.decorate(self.rng.choice(T.GREETINGS)), T.GREETING_REPLY
        if r < 0.5:
            return self.decorate(self.rng.choice(T.IDENTITY)), T.GREETING_REPLY
        return self.decorate(self.rng.choice(T.OUT_OF_DOMAIN)), T.OOD_REPLY

    def simple_turn(self):
        kind = self.rng.choice(["arith", "arith", "capital", "country", "chat"])
        if kind == "arith":
            q, expr, result = self.arith_question()
            return q, f"{expr} = {result}."
        if kind == "chat":
            return self.chat_qa()
        q, answer, _ = self.capital_qa() if kind == "capital" else self.country_qa()
        return q, answer

    def example(self, skill: str) -> Example:
        """Draws one example of `skill` (a key of SKILL_WEIGHTS)."""
        ex = getattr(self, "_" + skill)()
        if not self.heldout:
            prefix = []
            if self.rng.random() < 0.2:
                for _ in range(self.rng.randint(1, 2)):
                    q, a = self.simple_turn()
                    prefix += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            if self.rng.random() < 0.25:
                prefix.insert(0, {"role": "system", "content": self.rng.choice(T.SYSTEM_PROMPTS)})
            ex.messages = prefix + ex.messages
            ex.enable_thinking = self.rng.random() >= 0.15
        return ex

    def _maybe_tools(self, p: float, weather: bool = True):
        return self.tools(weather=weather, calc=False) if self.rng.random() < p else None

    def _arith(self):
        q, expr, result = self.arith_question()
        tools = None if self.heldout else self._maybe_tools(0.15)
        return Example("arith", [user(q), asst(f"{expr} = {result}.")], tools,
                       expected={"result": result})

    def _capital(self):
        q, answer, cap = self.capital_qa()
        tools = None if self.heldout else self._maybe_tools(0.2)
        if tools is not None and self.rng.random() < 0.5:
            tools = self.tools(weather=True, calc=True)
        return Example("capital", [user(q), asst(answer)], tools, expected={"answer": cap})

    def _country(self):
        q, answer, country = self.country_qa()
        return Example("country", [user(q), asst(answer)], None if self.heldout
                       else self._maybe_tools(0.15), expected={"answer": country})

    def _chat(self):
        q, answer = self.chat_qa()
        tools = None if self.heldout else self._maybe_tools(0.2)
        return Example("chat", [user(q), asst(answer)], tools, expected={"answer": answer})

    def _weather_q(self):
        city = self.city()
        q = self.pick(T.WEATHER_TRAIN, T.WEATHER_HELDOUT).format(city=city)
        return self.decorate(q), city

    def _weather_call(self):
        q, city = self._weather_q()
        tools = self.tools(weather=True, calc=self.heldout or self.rng.random() < 0.5)
        call = tool_call("get_weather", {"city": city})
        return Example("weather_call", [user(q), call], tools,
                       expected={"name": "get_weather", "arguments": {"city": city}})

    def _weather_answer(self):
        ex = self._weather_call()
        city = ex.expected["arguments"]["city"]
        cond = self.rng.choice(T.CONDITIONS)
        unit = "fahrenheit" if self.rng.random() < 0.25 else "celsius"
        temp = self.rng.randint(-20, 40) if unit == "celsius" else self.rng.randint(0, 100)
        sym = "°F" if unit == "fahrenheit" else "°C"
        if self.heldout or self.rng.random() < 0.75:
            response = json.dumps({"city": city, "temperature": temp, "unit": unit,
                                   "condition": cond}, ensure_ascii=False)
        else:
            response = f"{city}: {temp}{sym}, {cond}"
        answer = f"The weather in {city} is {cond}, {temp}{sym}."
        msgs = ex.messages + [{"role": "tool", "content": response}, asst(answer)]
        return Example("weather_answer", msgs, ex.tools,
                       expected={"city": city, "temperature": temp, "condition": cond})

    def _weather_notool(self):
        q, city = self._weather_q()
        tools = None if self.heldout or self.rng.random() < 0.7 else self.tools(False, True)
        answer = f"I can't check the weather in {city} without a weather tool."
        return Example("weather_notool", [user(q), asst(answer)], tools,
                       expected={"answer": answer})

    def _calc_call(self):
        q, expr, result = self.arith_question()
        tools = self.tools(weather=self.heldout or self.rng.random() < 0.5, calc=True)
        call = tool_call("calculate", {"expression": expr})
        return Example("calc_call", [user(q), call], tools,
                       expected={"name": "calculate", "arguments": {"expression": expr},
                                 "result": result})

    def _calc_answer(self):
        ex = self._calc_call()
        expr, result = ex.expected["arguments"]["expression"], ex.expected["result"]
        use_json = not self.heldout and self.rng.random() < 0.4
        response = json.dumps({"result": result}) if use_json else str(result)
        msgs = ex.messages + [{"role": "tool", "content": response}, asst(f"{expr} = {result}.")]
        return Example("calc_answer", msgs, ex.tools, expected={"result": result})


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def asst(text: str) -> dict:
    return {"role": "assistant", "content": text}


def upper_first(s: str) -> str:
    return s[:1].upper() + s[1:]


def dot(s: str) -> str:
    return "" if s.endswith(".") else "."


def hash_bucket(name: str) -> int:
    return hashlib.blake2b(name.encode(), digest_size=4).digest()[0] % 8


def build_corpus(seed: int, num_examples: int) -> list[Example]:
    """Draws `num_examples` training examples with skills in SKILL_WEIGHTS proportions."""
    builder = CorpusBuilder(seed)
    skills = builder.rng.choices(list(SKILL_WEIGHTS), weights=list(SKILL_WEIGHTS.values()),
                                 k=num_examples)
    return [builder.example(s) for s in skills]


def build_eval_set(seed: int, per_skill: dict[str, int]) -> list[Example]:
    """Draws held-out examples: `per_skill` maps a skill name to how many to draw.

    All use held-out numbers and cities. Facts always use held-out phrasings; the other skills
    use training phrasings unless the name ends in ``_para`` (e.g. ``arith_para``).
    """
    out = []
    for i, (name, n) in enumerate(per_skill.items()):
        skill = name.removesuffix("_para")
        para = name.endswith("_para") or skill in ("capital", "country")
        builder = CorpusBuilder(seed * 1000 + i, heldout=True, paraphrase=para)
        for _ in range(n):
            ex = builder.example(skill)
            ex.skill = name
            out.append(ex)
    return out

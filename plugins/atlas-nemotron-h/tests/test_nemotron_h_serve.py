"""Tool-call round trips through the HTTP server and the official OpenAI SDK with the real
Nemotron chat templates, their auto-selected parsers and ``<think>`` reasoning.

- The tiny Nemotron-H checkpoint itself (numpy backend) with the Nemotron-3 Nano template and a
  forced tool choice: the grammar makes the random model write a ``<tool_call><function=...>``
  block, the server parses it into a call, and the tool result goes into the next prompt.
- A scripted model (the engine's fake, the checkpoint's tokenizer, the Nano-v2 template) for
  the ``auto`` choice in Nano-v2's ``<TOOLCALL>[...]</TOOLCALL>`` form: reasoning, content and
  a call, streamed and whole, then the answer once the tool result is in the prompt.

The round trips themselves are :mod:`atlas_core.testing.serving`'s.
"""

from __future__ import annotations

import json
import shutil

import pytest
from nemotron_checkpoints import TEMPLATES

from atlas_core.api import EngineArgs, LLMEngine, Tokenizer
from atlas_core.testing.serving import (ToolCallScript, check_auto_tool_call,
                                        check_forced_tool_call, openai_client, scripted_engine,
                                        serve)

pytest.importorskip("openai")

pytestmark = pytest.mark.timeout(300)

CALL = '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>'
PROMPT_END = "<SPECIAL_11>Assistant\n<think>\n"


def test_forced_call_from_the_tiny_checkpoint(checkpoint):
    engine = LLMEngine.from_args(EngineArgs(model=str(checkpoint), backend="numpy",
                                            num_kv_blocks=96, max_num_seqs=2))
    with serve(engine, "nh") as server:
        check_forced_tool_call(openai_client(server), "nh")


@pytest.fixture(scope="module")
def scripted(checkpoint, tmp_path_factory):
    path = tmp_path_factory.mktemp("nano_v2")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(checkpoint / name, path / name)
    tok_config = json.loads((path / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = TEMPLATES["nano_v2"].read_text(encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config))
    tok = Tokenizer.from_dir(path)
    # Nano-v2 renders a tool result as <TOOL_RESPONSE>[...]
    script = ToolCallScript(tok, PROMPT_END, CALL, answered="<TOOL_RESPONSE>[sunny")
    engine = scripted_engine(tok, script, {"architectures": ["NemotronHForCausalLM"],
                                           "model_type": "nemotron_h"})
    with serve(engine, "nh") as server:
        yield openai_client(server)


def test_auto_toolcall_list_with_reasoning(scripted):
    check_auto_tool_call(scripted, "nh")

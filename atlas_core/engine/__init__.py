"""The inference engine: scheduling, paged KV cache, sampling, stop handling, async serving loop.

>>> engine = LLMEngine.from_args(EngineArgs(model="Qwen/Qwen3-0.6B"))
>>> engine.add_request("r1", [9707, 11], SamplingParams(max_tokens=8))
>>> while engine.has_unfinished_requests():
...     outputs = engine.step()
"""

from atlas_core.engine.args import EngineArgs
from atlas_core.engine.async_engine import (AsyncLLMEngine, EngineDeadError, QueueFull,
                                            RequestError)
from atlas_core.engine.block_manager import BlockManager
from atlas_core.engine.llm_engine import LLMEngine
from atlas_core.engine.model_runner import ModelRunner
from atlas_core.engine.outputs import (CompletionOutput, EngineStats, RequestMetrics,
                                       RequestOutput, TokenLogprob)
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.engine.scheduler import Scheduler
from atlas_core.engine.sequence import Sequence, SequenceGroup

__all__ = [
    "AsyncLLMEngine", "BlockManager", "CompletionOutput", "EngineArgs", "EngineDeadError",
    "EngineStats", "LLMEngine", "ModelRunner", "QueueFull", "RequestError", "RequestMetrics",
    "RequestOutput", "SamplingParams", "Scheduler", "Sequence", "SequenceGroup", "TokenLogprob",
]

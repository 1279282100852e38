"""Scheduling policies: each rule alone, then fifo vs slo under a mixed load on a simulated clock.

The mixed load drives the real :class:`Scheduler` and :class:`BlockManager` with a step cost
of ``4 ms + 20 us per token`` (a simulated clock; no model), 30 streaming chats and two 32k-token
prompts. The claim is relative: slo keeps the chats' p99 time-between-tokens under the target
where fifo does not, and the long prompts still finish their prefill.
"""

import numpy as np
import pytest

from atlas_core.engine import SamplingParams
from atlas_core.engine.args import EngineArgs
from atlas_core.engine.block_manager import BlockManager
from atlas_core.engine.scheduler import Scheduler
from atlas_core.engine.scheduling_policy import (MIN_PREFILL_CHUNK, SchedulingPolicy, SloPolicy,
                                                 StepCostModel, create_scheduling_policy)
from atlas_core.engine.sequence import Sequence


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def seq(rid, n, priority=0, max_tokens=8):
    return Sequence(rid, 0, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens,
                                                                  priority=priority), 0)


def decoding(rid, n=4):
    s = seq(rid, n)
    s.output_token_ids.append(1)
    s.num_computed_tokens = len(s) - 1
    return s


def test_cost_model_fits_base_and_per_token():
    cost = StepCostModel()
    assert cost.tokens_within(0.01) is None
    for tokens in (1, 100, 500, 2000):
        cost.observe(tokens, 0.004 + 2e-5 * tokens)
    base, per_token = cost.fit()
    assert base == pytest.approx(0.004) and per_token == pytest.approx(2e-5)
    assert cost.tokens_within(0.014) == pytest.approx(500, abs=1)
    cost.observe(100, 5.0)  # the engine sat idle between two steps: not a step cost
    assert cost.fit()[1] == pytest.approx(2e-5)


def test_decode_rows_nearest_their_deadline_go_first():
    clock = Clock()
    policy = SloPolicy(0.05, clock=clock)
    a, b, c = decoding("a"), decoding("b"), decoding("c")
    policy.last_token.update({a.seq_id: 0.03, b.seq_id: 0.01, c.seq_id: 0.02})
    prefill = seq("p", 100)
    assert policy.order_running([prefill, a, b, c], 0.04) == [b, c, a, prefill]


def test_prefill_budget_fits_the_time_left():
    clock = Clock()
    policy = SloPolicy(0.02, clock=clock)
    for tokens in (10, 1000):
        policy.cost.observe(tokens, 0.004 + 2e-5 * tokens)
    rows = [decoding(str(i)) for i in range(10)]
    for r in rows:
        policy.last_token[r.seq_id] = 0.0
    # 20 ms deadline, 4 ms fixed: 800 tokens fit, 10 are decode rows
    assert policy.prefill_budget(2048, rows, 0.0) == 790
    assert policy.prefill_budget(2048, rows, 0.019) == MIN_PREFILL_CHUNK
    assert policy.prefill_budget(2048, [seq("p", 50)], 0.0) == 2048
    assert SchedulingPolicy().prefill_budget(2048, rows, 0.0) == 2048


def test_admission_shortest_first_with_priority_and_an_age_cap():
    clock = Clock()
    policy = SloPolicy(0.05, age_cap_s=1.0, clock=clock)
    long, short, urgent = seq("long", 5000), seq("short", 20), seq("urgent", 900, priority=-1)
    assert policy.order_waiting([long, short, urgent], 0.0) == [urgent, short, long]
    later = seq("later", 10)
    assert policy.order_waiting([long, short, urgent, later], 1.5) == [long, short, urgent, later]
    resumed = decoding("resumed", 3000)
    assert policy.order_waiting([short, resumed], 1.5)[0] is resumed
    assert SchedulingPolicy().order_waiting([long, short], 0.0) is None


def test_create_policy_names_and_errors():
    assert create_scheduling_policy("fifo", 50, 2000).name == "fifo"
    assert create_scheduling_policy("slai", 50, 2000).name == "slo"
    with pytest.raises(ValueError, match="scheduling_policy must be one of fifo, slo, slai"):
        create_scheduling_policy("edf", 50, 2000)
    with pytest.raises(ValueError, match="tbt_deadline_ms"):
        create_scheduling_policy("slo", 0, 2000)
    with pytest.raises(ValueError, match="scheduling_policy"):
        EngineArgs(scheduling_policy="lifo")


def simulate(policy_name):
    clock = Clock()
    policy = create_scheduling_policy(policy_name, 15.0, 2000.0, clock)
    sched = Scheduler(BlockManager(6000, 16, False), 64, 64, 2048, policy=policy)
    rng = np.random.default_rng(0)
    arrivals = [(0.005 * i, f"chat{i}", int(rng.integers(50, 200)), 64) for i in range(30)]
    arrivals += [(0.10, "long0", 32_000, 4), (0.60, "long1", 32_000, 4)]
    arrivals.sort()
    times: dict[str, list[float]] = {}
    start = {rid: t for t, rid, _, _ in arrivals}
    pending = list(arrivals)
    while pending or sched.running or sched.waiting:
        while pending and pending[0][0] <= clock.now:
            _, rid, n, max_tokens = pending.pop(0)
            sched.add(seq(rid, n, max_tokens=max_tokens))
        out = sched.schedule()
        if not out.scheduled:
            clock.now = pending[0][0]
            continue
        clock.now += 0.004 + 2e-5 * out.num_tokens
        sched.complete_step(out)
        for s in out.scheduled:
            if s.samples:
                s.seq.output_token_ids.append(1)
                times.setdefault(s.seq.request_id, []).append(clock.now)
                if len(s.seq.output_token_ids) >= s.seq.params.max_tokens:
                    sched.finish(s.seq)
    gaps = np.concatenate([np.diff(t) for rid, t in times.items() if rid.startswith("chat")])
    ttft = [times[rid][0] - start[rid] for rid in ("long0", "long1")]
    return float(np.percentile(gaps, 99)), max(ttft)


def test_mixed_load_slo_keeps_chats_under_target_and_long_prompts_progress():
    fifo_tbt, fifo_ttft = simulate("fifo")
    slo_tbt, slo_ttft = simulate("slo")
    print(f"p99 TBT of chats: fifo {fifo_tbt * 1e3:.1f} ms, slo {slo_tbt * 1e3:.1f} ms; "
          f"TTFT of 32k prompts: fifo {fifo_ttft:.2f} s, slo {slo_ttft:.2f} s")
    assert fifo_tbt > 0.03
    assert slo_tbt <= 0.0155
    assert slo_tbt < fifo_tbt / 2
    assert slo_ttft < 4 * fifo_ttft


def test_slo_engine_outputs_match_fifo_and_the_reference():
    from atlas_core.testing.fake_model import make_fake_engine, run_to_completion

    prompts = {f"r{i}": [(i * 7 + j * 3) % 60 + 1 for j in range(5 + 40 * (i % 3))] for i in range(6)}
    outs = {}
    for policy in ("fifo", "slo"):
        engine = make_fake_engine(scheduling_policy=policy, tbt_deadline_ms=0.001,
                                  max_prefill_tokens=70, num_kv_blocks=128)
        for i, (rid, p) in enumerate(prompts.items()):
            engine.add_request(rid, p, SamplingParams(temperature=0, max_tokens=6, priority=-i))
        outs[policy] = {r: o.outputs[0].token_ids for r, o in run_to_completion(engine).items()}
        assert engine.scheduler.policy.name == policy
    assert outs["slo"] == outs["fifo"]
    assert outs["slo"]["r5"] == engine.model.greedy(prompts["r5"], 6)


def test_serve_flags_reach_engine_args(tmp_path):
    import argparse

    from atlas_core.cli import UserError
    from atlas_core.cli.serve import add_parser, engine_args

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "m", "--scheduling-policy", "slai", "--tbt-deadline-ms",
                              "25", "--max-tool-calls", "0", "--no-scrub-tool-markup"])
    eargs = engine_args(args)
    assert (eargs.scheduling_policy, eargs.tbt_deadline_ms) == ("slai", 25.0)
    assert eargs.max_tool_calls == 0 and eargs.scrub_tool_markup is False
    bad = parser.parse_args(["serve", "m", "--sampling-presets", str(tmp_path / "none.json")])
    with pytest.raises(UserError, match="cannot read sampling presets file"):
        engine_args(bad)

"""Scheduling policies: each rule alone, then fifo vs slo under mixed loads on a simulated clock.

Two simulations drive the real :class:`Scheduler` and :class:`BlockManager` (no model). The
simple one: a linear step cost of ``4 ms + 20 us per token`` (no decode graphs: every step
costs alike), 30 streaming chats and two 32k-token prompts, a 15 ms target; there slo cuts
prefill chunks to the deadline. The realistic one (:mod:`atlas_core.testing.sched_sim`):
``scripts/sched_bench.py``'s load and a step cost fitted to qwen3-8b on the H200, where a
step with any prefill chunk runs eagerly (27 ms more than a graph decode step), a late chunk
of a long prompt costs more per token and a small one no less than a GPU wave; there slo
rations eager steps. The claims are relative: slo keeps the chats' p99 time-between-tokens
under the target and far under fifo's, at fifo's TTFT p99s.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from atlas_core.engine import SamplingParams
from atlas_core.engine.args import EngineArgs
from atlas_core.engine.block_manager import BlockManager
from atlas_core.engine.scheduler import Scheduler
from atlas_core.engine.scheduler import ScheduledSeq
from atlas_core.engine.scheduling_policy import (INTERRUPT_SHARE, MAX_CREDIT_ROWS,
                                                 MIN_EAGER_SAMPLES, MIN_PREFILL_CHUNK,
                                                 STALL_DEADLINES, SchedulingPolicy, SloPolicy,
                                                 StepCostModel, create_scheduling_policy,
                                                 step_features)
from atlas_core.engine.sequence import Sequence
from atlas_core.testing import sched_sim


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


def late_chunk_cost(tokens, pairs, context):
    return 0.005 + 2e-5 * tokens + 4e-9 * pairs + 1e-6 * context


def test_cost_model_fits_the_attention_terms():
    cost = StepCostModel()
    for start in (0, 4000, 12000, 30000):
        for n in (64, 300, 2000):
            tokens, pairs, context = n + 8, n * (start + n / 2), start + n / 2
            cost.observe(tokens, late_chunk_cost(tokens, pairs, context), pairs, context)
        cost.observe(8, late_chunk_cost(8, 0, 0))
    coef = cost.coefficients()
    assert coef.base == pytest.approx(0.005) and coef.per_token == pytest.approx(2e-5)
    assert coef.per_pair == pytest.approx(4e-9) and coef.per_context == pytest.approx(1e-6)
    for start in (0, 30000):
        n = cost.tokens_within(0.05, start, num_rows=8)
        fits = [late_chunk_cost(k + 8, k * (start + k / 2), start + k / 2) for k in (n, n + 1)]
        assert fits[0] <= 0.05 < fits[1]
    assert cost.tokens_within(0.05, 30000, 8) < cost.tokens_within(0.05, 0, 8) / 4
    assert cost.tokens_within(0.004, 0, 8) == 0


def test_cost_model_fits_the_eager_cost_of_steps_with_a_prefill_chunk():
    cost = StepCostModel()
    for rows in (1, 8, 30):
        cost.observe(rows, 0.005 + 2e-5 * rows)
    for n in (64, 200, 1000, 4000):
        cost.observe(n + 8, 0.032 + 2e-5 * (n + 8), 0.0, 0.0, 1.0)
    coef = cost.coefficients()
    assert coef.base == pytest.approx(0.005) and coef.eager == pytest.approx(0.027)
    assert cost.predict(8, eager=1.0) == pytest.approx(0.032 + 8 * 2e-5)
    # 50 ms beside 8 rows: 5 ms + 27 ms + 8 rows leave 892 tokens, not the 2,242 of a graph step
    assert cost.tokens_within(0.05, 0, 8) == 892
    assert cost.num_eager == 4


def test_margin_is_capped_so_it_cannot_spiral():
    cost = StepCostModel()
    for tokens in (1, 100, 500, 2000):
        cost.observe(tokens, 0.004 + 2e-5 * tokens)
    cost.observe(400, 5 * cost.predict(400, 1e5, 300), 1e5, 300)
    assert cost.margin() == 2.0


def test_cost_model_drops_a_coefficient_that_fits_negative():
    cost = StepCostModel()
    for i, n in enumerate((10, 500, 1000, 3000)):
        context = 1000.0 * i
        cost.observe(n, 0.01 + 2e-5 * n - 1e-7 * context, 0.0, context)
    coef = cost.coefficients()
    assert coef.per_context == 0 and min(coef) >= 0 and coef.per_token > 0


def test_margin_is_how_far_prefill_steps_overran_their_prediction():
    cost = StepCostModel()
    for tokens in (1, 100, 500, 2000):
        cost.observe(tokens, 0.004 + 2e-5 * tokens)
    assert cost.margin() == 1.0
    cost.observe(400, 1.5 * cost.predict(400, 1e5, 300), 1e5, 300)
    assert cost.margin() == pytest.approx(1.5)
    cost.observe(50, 3 * cost.predict(50))  # decode steps are not what the margin guards
    assert cost.margin() == pytest.approx(1.5)


def test_step_features_count_attention_of_prefill_chunks_only():
    row, chunk = decoding("d", 40), seq("p", 300)
    scheduled = [ScheduledSeq(row, 39, 1), ScheduledSeq(chunk, 100, 50)]
    assert step_features(scheduled) == (51, 50 * 125.0, 125.0, 1.0)
    assert step_features(scheduled[:1]) == (1, 0.0, 0.0, 0.0)


def test_deadline_runs_from_the_end_of_the_step_that_gave_the_token():
    policy = SloPolicy(0.05)
    a = decoding("a")
    policy.on_step([ScheduledSeq(a, len(a) - 1, 1)], 1, 0.0)
    assert policy.last_token[a.seq_id] == 0.0
    policy.order_running([a], 0.03)
    assert policy.last_token[a.seq_id] == 0.03 and policy._deadline(a, 0.03) == 0.08
    assert policy.cost.predict(1) == pytest.approx(0.03)
    policy.forget(a)
    policy.on_step([ScheduledSeq(a, len(a) - 1, 1)], 1, 0.04)
    policy.forget(a)
    policy.prefill_budget(64, [], 0.05)
    assert a.seq_id not in policy.last_token


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


def graph_backend_policy(clock, rows):
    """An slo policy that has measured 5 ms graph decode steps and 27 ms-dearer eager steps,
    with ``rows`` decoding sequences whose last token came at 0."""
    policy = SloPolicy(0.05, age_cap_s=2.0, clock=clock)
    for n in (30, 8, 1):
        policy.cost.observe(n, 0.005 + 2e-5 * n)
    for i in range(MIN_EAGER_SAMPLES):
        n = 200 * (i + 1)
        policy.cost.observe(n, 0.032 + 2e-5 * n, 0.0, 0.0, 1.0)
    decoders = [decoding(f"d{i}") for i in range(rows)]
    for d in decoders:
        policy.last_token[d.seq_id] = 0.0
    return policy, decoders


def test_slo_rations_eager_steps_when_a_prefill_chunk_costs_more_than_a_decode_step():
    clock = Clock()
    policy, rows = graph_backend_policy(clock, 10)
    chat = seq("chat", 200)
    assert policy.prefill_budget(8192, rows, 0.0, [chat]) == 0  # no credit: a graph step
    assert policy.eager_interrupts(10)
    decode_step = [ScheduledSeq(r, len(r) - 1, 1) for r in rows]
    steps = 0
    while policy.prefill_budget(8192, rows, 0.0, [chat]) == 0:
        policy.on_step(decode_step, len(rows), 0.0)
        steps += 1
    assert steps == pytest.approx(1 / INTERRUPT_SHARE, abs=1)
    # admitted in a chunk sized to the stall bound, here the whole budget
    assert policy.prefill_budget(8192, rows, 0.0, [chat]) == 8192
    policy.on_step(decode_step + [ScheduledSeq(chat, 0, 200)], 210, 0.0)
    assert policy.credit == pytest.approx(0.0, abs=INTERRUPT_SHARE * 10)
    for _ in range(10 ** 5):
        policy.on_step(decode_step, len(rows), 0.0)
    assert policy.credit == MAX_CREDIT_ROWS


def test_slo_admits_without_credit_after_the_age_cap_for_a_preempted_stream_or_a_full_step():
    clock = Clock()
    policy, rows = graph_backend_policy(clock, 10)
    chat, resumed, long = seq("chat", 200), decoding("resumed", 300), seq("long", 9000)
    assert policy.prefill_budget(8192, rows, 0.0, [chat]) == 0
    assert policy.prefill_budget(8192, rows, 2.0, [chat]) > 0
    assert policy.prefill_budget(8192, rows, 2.0, [resumed]) > 0
    assert policy.prefill_budget(8192, rows, 2.0, [long]) > 0
    assert policy.prefill_budget(8192, rows, 2.0, [seq("more", 200)]) == 0


def test_slo_continues_a_started_prompt_in_chunks_within_the_stall_bound():
    clock = Clock()
    policy, rows = graph_backend_policy(clock, 10)
    for start in (0, 30000):
        pairs = 1000 * (start + 500.0)
        policy.cost.observe(1010, 0.032 + 2e-5 * 1010 + 4e-9 * pairs, pairs, start + 500.0, 1.0)
    started = seq("long", 64000)
    started.num_computed_tokens = 50000
    n = policy.prefill_budget(8192, rows + [started], 0.0)
    assert MIN_PREFILL_CHUNK < n < 8192
    stall = STALL_DEADLINES * policy.tbt_deadline_s / policy.cost.margin()
    predicted = policy.cost.predict(n + 10, n * (50000 + n / 2), 50000 + n / 2, eager=1.0)
    assert 0.9 * stall < predicted <= stall


def test_schedule_ahead_plans_through_prompts_the_policy_holds_back():
    clock = Clock()
    for policy, planned in ((SchedulingPolicy(), False), (graph_backend_policy(clock, 0)[0], True)):
        sched = Scheduler(BlockManager(64, 16, False), 8, 8, 512, policy=policy)
        for i in range(2):
            sched.add(seq(f"r{i}", 20, max_tokens=50))
        first = sched.schedule()
        sched.complete_step(first)
        for s in first.scheduled:
            s.seq.output_token_ids.append(1)
        prev = sched.schedule()
        assert prev.is_decode_only
        sched.add(seq("late", 30))
        ahead = sched.schedule_ahead(prev, [s.seq for s in prev.scheduled])
        assert (ahead is not None) is planned


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
    """The simple load on a linear step cost, run by ``sched_sim.simulate``: ``(p99 time
    between chat tokens, largest TTFT of the long prompts)``."""
    rng = np.random.default_rng(0)
    arrivals = [(0.005 * i, f"chat{i}", int(rng.integers(50, 200)), 64) for i in range(30)]
    arrivals += [(0.10, "long0", 32_000, 4), (0.60, "long1", 32_000, 4)]
    arrivals.sort()
    out = sched_sim.simulate(policy_name, SimpleNamespace(arrivals=lambda: list(arrivals)),
                             cost=lambda step: 0.004 + 2e-5 * step.num_tokens,
                             tbt_deadline_ms=15.0, max_prefill_tokens=2048, max_num_seqs=64,
                             jitter=0.0, num_blocks=6000)
    return out["chat_tbt_p99"], out["long_ttft_max"]


def test_mixed_load_slo_keeps_chats_under_target_and_long_prompts_progress():
    fifo_tbt, fifo_ttft = simulate("fifo")
    slo_tbt, slo_ttft = simulate("slo")
    print(f"p99 TBT of chats: fifo {fifo_tbt * 1e3:.1f} ms, slo {slo_tbt * 1e3:.1f} ms; "
          f"TTFT of 32k prompts: fifo {fifo_ttft:.2f} s, slo {slo_ttft:.2f} s")
    assert fifo_tbt > 0.03
    assert slo_tbt <= 0.0155
    assert slo_tbt < fifo_tbt / 2
    assert slo_ttft < 4 * fifo_ttft


@pytest.mark.parametrize("case", [
    {},
    {"jitter": 0.10, "seed": 1},
    {"cost": sched_sim.StepCost(per_token=36e-6, per_pair=1.73e-9)},  # 30% of 32k is attention
], ids=["h200-qwen3-8b", "jitter-10pct", "attention-30pct"])
def test_realistic_mixed_load_slo_meets_the_target_at_fifo_like_ttft(case):
    fifo = sched_sim.simulate("fifo", **case)
    slo = sched_sim.simulate("slo", **case)
    for name, r in (("fifo", fifo), ("slo", slo)):
        print(f"{name}: chat TBT p50 {r['chat_tbt_p50'] * 1e3:.1f} ms, p99 "
              f"{r['chat_tbt_p99'] * 1e3:.1f} ms, max {r['chat_tbt_max'] * 1e3:.1f} ms; chat TTFT "
              f"p99 {r['chat_ttft_p99']:.2f} s; 32k TTFT {r['long_ttft_max']:.2f} s")
    target = 0.050
    assert fifo["chat_tbt_max"] > 10 * target
    assert slo["chat_tbt_p99"] <= target and slo["chat_tbt_p99"] < fifo["chat_tbt_p99"] / 2
    assert slo["chat_tbt_max"] < fifo["chat_tbt_max"]
    assert slo["chat_tbt_p50"] < 1.2 * fifo["chat_tbt_p50"]
    assert slo["chat_ttft_p99"] < 1.2 * fifo["chat_ttft_p99"]
    assert slo["long_ttft_max"] < 1.2 * fifo["long_ttft_max"]


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

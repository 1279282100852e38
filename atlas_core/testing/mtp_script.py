"""A request script for MTP speculation tests that records the drafts of every step.

Draft graphs (``draft_graphs``) must give the eager drafts whatever the batch does, so their
tests, on CPU backends in core and on the cuda backend in the atlas-qwen35 plugin, run the same
script twice (graphs off, then on) and compare the drafts after every step, not just the final
tokens: a wrong draft that the verify step rejects leaves the tokens equal. Requests arrive at
given steps, so batches grow past the 1 / 2 / 4 buckets, then shrink and refill as sequences
finish and later ones join.
"""

from __future__ import annotations

import numpy as np

from atlas_core.api import SamplingParams

#: The speculative config of the scripts: the gate never stops drafting (a draft costs nothing)
#: and speculation stays on up to batches of 4, the largest bucket the scripts reach.
MTP_SPEC = {"method": "mtp", "num_speculative_tokens": 3, "draft_token_cost": 0.0,
            "disable_by_batch_size": 4}


def run_requests(engine, requests: list[tuple[int, int, int]], seed: int,
                 vocab_size: int = 370) -> tuple[list[dict], dict[str, list[int]]]:
    """Step ``engine`` until ``requests`` finish; returns ``(log, final)``.

    Args:
        engine: an ``LLMEngine`` speculating with an MTP proposer.
        requests: ``(arrival step, prompt length, max_tokens)`` of each request ``r<i>``;
            prompts are random ids below ``vocab_size`` drawn with ``seed``, decoded greedily.
        seed: seed of the prompts.
        vocab_size: bound of the prompt ids.

    Returns:
        ``log[i]`` maps each request id to the ``(sequence length, drafts)`` the proposer
        holds after its ``i``-th ``observe``; ``final`` maps request ids to their output
        token ids.
    """
    proposer = engine.speculator.proposer
    log: list[dict] = []
    observe = proposer.observe

    def recording(layout):
        observe(layout)
        rid = {seq.seq_id: seq.request_id for seq, _, _ in layout}
        log.append({rid[k]: (n, list(d)) for k, (n, d) in proposer.drafts.items()})

    proposer.observe = recording
    rng = np.random.default_rng(seed)
    pending = [(at, f"r{i}", rng.integers(0, vocab_size, n).tolist(), SamplingParams(
        temperature=0, max_tokens=m, ignore_eos=True)) for i, (at, n, m) in enumerate(requests)]
    final, step = {}, 0
    while pending or engine.has_unfinished_requests():
        for at, rid, prompt, params in pending:
            if at <= step:
                engine.add_request(rid, prompt, params)
        pending = [p for p in pending if p[0] > step]
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.outputs[0].token_ids
        step += 1
    return log, final

"""Turns the synthetic corpus into token ids with loss masks, and batches them.

Corpus drawing and rendering run in worker processes over fixed shards (shard i is seeded from
(seed, i)), so the result does not depend on how many processes run them.
"""

from concurrent.futures import ProcessPoolExecutor

import numpy as np

import corpus
import render

NUM_SHARDS = 64


def _render_shard(args) -> list[tuple[str, str, str]]:
    seed, shard, count = args
    examples = corpus.build_corpus(seed * 100_003 + shard, count)
    return [(ex.skill, *render.split_example(ex.messages, ex.tools, ex.enable_thinking))
            for ex in examples]


def render_corpus(seed: int, num_examples: int, workers: int) -> list[tuple[str, str, str]]:
    """Draws and renders the corpus: a list of (skill, prompt_text, completion_text)."""
    per = [num_examples // NUM_SHARDS + (i < num_examples % NUM_SHARDS)
           for i in range(NUM_SHARDS)]
    jobs = [(seed, i, n) for i, n in enumerate(per)]
    if workers <= 1:
        shards = map(_render_shard, jobs)
    else:
        with ProcessPoolExecutor(workers) as pool:
            shards = list(pool.map(_render_shard, jobs))
    return [row for shard in shards for row in shard]


def tokenize(tok, rows, max_len: int) -> tuple[list[np.ndarray], list[int], list[str]]:
    """Encodes rendered rows; drops those longer than `max_len` tokens.

    Returns (token id arrays ending in <|im_end|>, prompt lengths, skills). The loss covers the
    tokens after the prompt: the assistant's turn up to and including <|im_end|>.
    """
    prompts = tok.encode_batch([p for _, p, _ in rows], add_special_tokens=False)
    fulls = tok.encode_batch([p + c for _, p, c in rows], add_special_tokens=False)
    im_end = tok.token_to_id("<|im_end|>")
    seqs, prompt_lens, skills = [], [], []
    for (skill, _, _), p, f in zip(rows, prompts, fulls):
        ids = f.ids[:len(f.ids) - f.ids[::-1].index(im_end)]
        if ids[:len(p.ids)] != p.ids:
            raise ValueError("prompt tokens are not a prefix of the conversation tokens")
        if len(ids) <= max_len:
            seqs.append(np.asarray(ids, dtype=np.int32))
            prompt_lens.append(len(p.ids))
            skills.append(skill)
    return seqs, prompt_lens, skills


def batches(seqs, prompt_lens, batch_size: int, seed: int, pad_id: int):
    """Yields (input_ids, labels) int64 arrays [batch, max_len] forever, epoch after epoch.

    Each epoch is a seeded permutation; within groups of 32 batches, sequences are sorted by
    length so batches carry little padding, then the batches are shuffled. Labels are -100
    outside the assistant turn and on padding.
    """
    lengths = np.array([len(s) for s in seqs])
    epoch = 0
    while True:
        rng = np.random.default_rng([seed, epoch])
        order = rng.permutation(len(seqs))
        group = batch_size * 32
        chunks = []
        for g in range(0, len(order) - batch_size + 1, group):
            idx = order[g:g + group]
            idx = idx[np.argsort(lengths[idx], kind="stable")]
            chunks += [idx[i:i + batch_size] for i in range(0, len(idx) - batch_size + 1,
                                                            batch_size)]
        for b in rng.permutation(len(chunks)):
            yield _collate(chunks[b], seqs, prompt_lens, pad_id)
        epoch += 1


def _collate(idx, seqs, prompt_lens, pad_id):
    width = max(len(seqs[i]) for i in idx)
    inputs = np.full((len(idx), width), pad_id, dtype=np.int64)
    labels = np.full((len(idx), width), -100, dtype=np.int64)
    for row, i in enumerate(idx):
        s, p = seqs[i], prompt_lens[i]
        inputs[row, :len(s)] = s
        # position t predicts token t + 1
        labels[row, p - 1:len(s) - 1] = s[p:]
    return inputs, labels

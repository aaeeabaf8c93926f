"""Issue 37, sliding windows with the paged KV cache, without a model: the block manager gives back the blocks
behind the window of a model whose every layer is windowed (their table entries the null block), keeps them in
the prefix cache, adopts only the visible part of a prefix hit, and bounds what a sequence holds; the scheduler
releases before it grows a sequence; the KV-cache plan counts windows; and every attention kernel set gives the
same output over a table whose released entries point at the null block (the skipping kernels with NaN there:
they never read it; the gathering references with the zeros the engine keeps there: masked)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from inference.engine.block_manager import NULL_BLOCK, BlockManager, peak_blocks
from inference.engine.config import EngineConfig
from inference.engine.kv_sizing import KvCacheSizeError, MiB, engine_kv_plan
from inference.engine.model_config import ModelConfig
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import Scheduler
from inference.engine.scheduler_policy import PriorityPolicy
from inference.engine.sequence import Sequence

BS, W = 4, 8


def make_seq(n: int, rid: str = "a", start: int = 0) -> Sequence:
    return Sequence(rid, list(range(start, start + n)), SamplingParams(), max_tokens=64)


def advance(bm: BlockManager, seq: Sequence, n: int) -> int:
    """One step of `n` tokens as the scheduler runs it: release, grow, compute, register. -> blocks released."""
    table = seq.block_table
    released = bm.release_outside_window(seq)
    assert (seq.block_table is table) == (released == 0)  # released: a new list (the runner copies by appends)
    assert bm.allocate(seq, n)
    seq.num_computed_tokens += n
    while len(seq.token_ids) < seq.num_computed_tokens + 1:
        seq.append_token(1000 + len(seq.token_ids))  # the sampled token, known before the next step
    bm.cache_full_blocks(seq)
    return released


def held(seq: Sequence) -> int:
    return sum(b != NULL_BLOCK for b in seq.block_table)


def test_model_config_window_only_when_every_layer_is_local():
    base = dict(architecture="mistral", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2,
                num_heads=2, num_kv_heads=1, head_dim=8, rope_theta=1e4, rms_norm_eps=1e-5,
                max_position_embeddings=256, tie_word_embeddings=False)
    assert ModelConfig(**base).kv_window == 0
    assert ModelConfig(**base, sliding_window=16).kv_window == 16  # Mistral: every layer
    assert ModelConfig(**base, sliding_window=16, sliding_layers=(True, True)).kv_window == 16
    assert ModelConfig(**base, sliding_window=16, sliding_layers=(True, False)).kv_window == 0  # a global layer


@pytest.mark.parametrize("caching", [True, False])
def test_a_long_sequence_holds_its_window_and_gives_the_rest_back(caching):
    bm = BlockManager(12, BS, caching, window=W)
    assert bm.capacity == 11 and bm.num_free_blocks == 11  # the null block is nobody's
    seq = make_seq(6)
    advance(bm, seq, 6)  # the prompt
    most = 0
    for _ in range(60):  # decodes, 8 windows long
        advance(bm, seq, 1)
        most = max(most, held(seq))
        first_read = seq.num_computed_tokens - W  # the last computed query's first key (+1), less one
        for i, block_id in enumerate(seq.block_table):  # every block the window can still read is held
            if (i + 1) * BS > first_read:
                assert block_id != NULL_BLOCK, (i, seq.block_table)
        bm.check_invariants([seq])
    assert most == W // BS + 2 and most <= bm.peak_blocks(66, chunk=1)
    assert len(seq.block_table) == 17 and held(seq) <= W // BS + 2  # the table keeps its logical length
    assert bm.num_free_blocks == 11 - held(seq)
    released = [i for i, b in enumerate(seq.block_table) if b == NULL_BLOCK]
    assert released == list(range(len(released))) and len(released) >= 12  # a prefix of the table
    # released full blocks went to the prefix cache, evictable (the oldest reused since: 17 blocks > 11)
    assert len(bm._evictable) == (11 - held(seq)) * caching
    assert bm.num_cached_blocks == 10 * caching  # every block but the sequence's last, partial one
    bm.free(seq)
    assert bm.num_free_blocks == 11 and bm.usage == 0.0
    bm.check_invariants([])


def test_released_blocks_still_serve_a_later_prefix_and_a_hit_adopts_what_it_sees():
    bm = BlockManager(16, BS, window=W)
    first = make_seq(6)
    advance(bm, first, 6)
    for _ in range(34):
        advance(bm, first, 1)
    assert first.block_table[:6] == [NULL_BLOCK] * 6  # 40 computed: blocks 0..5 given back, cached
    again = Sequence("b", first.token_ids[:29], SamplingParams(), max_tokens=8)  # 7 full blocks in common
    hit = bm.match_prefix(again)
    assert len(hit) == 7 and not set(hit[:6]) & set(first.block_table)  # 6 of them given back by `first`
    free_before = bm.num_free_blocks
    assert bm.can_allocate(again, 1, hit) and bm.allocate(again, 1, hit)
    skip = (28 - W) // BS - 1  # what its first computed token (at 28) cannot see: blocks 0..3
    assert again.block_table[:skip] == [NULL_BLOCK] * skip and again.block_table[skip:7] == hit[skip:]
    assert again.num_registered_blocks == 7 and len(again.block_table) == 8
    assert bm.num_free_blocks == free_before - 2 - 1  # blocks 4 and 5 back from the cache, one fresh
    bm.check_invariants([first, again])
    bm.free(first)
    bm.free(again)
    assert bm.num_free_blocks == bm.capacity
    bm.check_invariants([])


def test_peak_blocks_bounds_a_sequence_in_chunks():
    assert peak_blocks(1000, block_size=16) == 63
    assert peak_blocks(1000, block_size=16, window=16, chunk=1) == 4
    assert peak_blocks(1000, block_size=16, window=16, chunk=100) == 10
    assert peak_blocks(40, block_size=16, window=16, chunk=100) == 3  # never more than the whole sequence
    for chunk in (1, 3, 5, 13):  # measured: held after every step of 100 tokens in chunks
        bm = BlockManager(64, BS, window=W)
        seq = make_seq(97)
        most = 0
        while seq.num_computed_tokens < 97:
            advance(bm, seq, min(chunk, 97 - seq.num_computed_tokens))
            most = max(most, held(seq))
        assert most <= bm.peak_blocks(97, chunk)


def test_the_scheduler_releases_before_it_grows_a_sequence_so_more_fit():
    bm = BlockManager(10, BS, window=W)  # 9 usable blocks: 36 tokens
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=16,
                      policy=PriorityPolicy(aging_s=None, max_preemptions=2))
    seqs = [make_seq(10, f"r{i}", start=100 * i) for i in range(2)]
    for seq in seqs:
        sched.add(seq)
    while min(s.num_tokens for s in seqs) < 50:  # 13 blocks each without the window, 26 for both
        batch = sched.schedule()
        sched.postprocess(batch)
        for seq in batch.seqs:
            if seq.num_computed_tokens == len(seq.token_ids):
                seq.append_token(7)
        bm.check_invariants(sched.running)
    assert sched.num_preemptions == 0 and all(held(s) <= W // BS + 2 for s in seqs)
    assert bm.num_free_blocks == 9 - held(seqs[0]) - held(seqs[1])


def test_the_kv_plan_sizes_a_windowed_model_by_its_window():
    model = ModelConfig(architecture="mistral", vocab_size=32, hidden_size=64, intermediate_size=32,
                        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=1e4, rms_norm_eps=1e-5,
                        max_position_embeddings=32768, tie_word_embeddings=False, sliding_window=64)
    config = EngineConfig(model="tiny", dtype="float32", max_num_seqs=4, max_num_batched_tokens=64)
    block_bytes = 2 * 2 * 16 * 2 * 16 * 4  # K and V, 2 layers, 16 tokens, 2 heads of 16 floats
    plan = engine_kv_plan(config, model, device=torch.device("cpu"), dtype=torch.float32, max_model_len=32768,
                          free_bytes=16 * MiB, weights=0)
    # 4 sequences of (window + decode: 7 blocks) + one block each, the step's chunks and the null block
    assert plan.num_blocks == 4 * 8 + 4 + 1 and plan.block_bytes == block_bytes
    unwindowed = dataclasses.replace(model, sliding_window=None)
    with pytest.raises(KvCacheSizeError, match="one 32768-token sequence"):  # 2048 blocks in 8 MiB: no
        engine_kv_plan(config, unwindowed, device=torch.device("cpu"), dtype=torch.float32, max_model_len=32768,
                       free_bytes=16 * MiB, weights=0)


# -- the kernels over a table whose released entries point at the null block ----------------------------

def _null_table_case(q_lens, seq_lens, window, fill):
    """A paged case, its cache with one more block (the null block, filled with `fill`) and its tables with the
    blocks the block manager would have released pointing there."""
    from tests.kernels.paged_cases import make_paged_case

    case = make_paged_case(q_lens, seq_lens, 4, 2, 16, BS, torch.float32, seed=31)
    null = case.k_cache.shape[0]
    extra = torch.full((1, *case.k_cache.shape[1:]), fill)
    k_cache, v_cache = torch.cat([case.k_cache, extra]), torch.cat([case.v_cache, extra])
    tables = case.block_tables.clone()
    bm = BlockManager(2, BS, window=window)
    released = 0
    for b, (q_len, length) in enumerate(zip(q_lens, seq_lens)):
        skip = bm._releasable(length - q_len)  # the step's first query position
        tables[b, :skip] = null
        released += skip
    assert released >= 4
    return case, k_cache, v_cache, tables


KERNEL_CASES = [([1, 1, 1, 1], [9, 23, 40, 61]), ([1, 7, 13, 1], [30, 40, 50, 33])]  # decodes; a mixed step


@pytest.mark.parametrize("q_lens, seq_lens", KERNEL_CASES)
@pytest.mark.parametrize("window", [1, 5, 8, 13])
def test_every_attention_kernel_set_ignores_the_null_block(q_lens, seq_lens, window):
    from kernels import cpu_native
    from kernels._triton import interpreter_active
    from kernels.paged_decode_attention import paged_decode_attention, paged_decode_attention_ref
    from kernels.paged_decode_attention_cpu import paged_decode_attention_cpu
    from kernels.prefill_attention import paged_prefill_attention, paged_prefill_attention_ref
    from kernels.row_attention import paged_attention_rows_cpu, paged_attention_rows_ref, paged_attention_rows_triton

    decode = max(q_lens) == 1
    kernels = [("ref", 0.0, paged_decode_attention_ref if decode else paged_prefill_attention_ref)]
    kernels += [("rows ref", 0.0, paged_attention_rows_ref)]
    if cpu_native.available():  # reads from the window on: NaN in the null block never shows
        kernels += [("rows cpu", float("nan"), paged_attention_rows_cpu)]
        kernels += [("cpu", float("nan"), paged_decode_attention_cpu)] * decode
    if interpreter_active():
        kernels += [("triton", float("nan"), paged_decode_attention if decode else paged_prefill_attention),
                    ("rows triton", float("nan"), paged_attention_rows_triton)]
    for name, fill, kernel in kernels:
        case, k_cache, v_cache, tables = _null_table_case(q_lens, seq_lens, window, fill)
        rows = name.startswith("rows")
        if rows:  # each query row alone: its sequence's table, its position + 1
            counts = torch.tensor(q_lens)
            row_seq = torch.repeat_interleave(torch.arange(len(q_lens)), counts)
            ends = torch.tensor(seq_lens).repeat_interleave(counts)
            offsets = torch.cat([torch.arange(n) - n + 1 for n in q_lens])
            lens = (ends + offsets).to(torch.int32)
            full = (case.q, case.k_cache, case.v_cache, case.block_tables[row_seq], lens, case.scale)
            nulled = (case.q, k_cache, v_cache, tables[row_seq], lens, case.scale)
        elif decode:
            full = (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
            nulled = (case.q, k_cache, v_cache, tables, case.seq_lens, case.scale)
        else:
            tail = (case.query_start_loc, case.seq_lens, case.scale, case.max_query_len, case.max_seq_len)
            full = (case.q, case.k_cache, case.v_cache, case.block_tables, *tail)
            nulled = (case.q, k_cache, v_cache, tables, *tail)
        want, got = kernel(*full, window=window), kernel(*nulled, window=window)
        assert torch.isfinite(got).all(), name
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6, msg=lambda m: f"{name}: {m}")

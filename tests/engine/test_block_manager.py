"""Block manager: allocation, reference counts, prefix caching with salts, LRU eviction."""

import pytest

from inference.engine.block_manager import BlockManager
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence

BS = 4


def make_seq(tokens, salt=None, rid=None):
    return Sequence(rid or f"r{id(tokens)}", list(tokens), SamplingParams(), max_tokens=8, cache_salt=salt)


def admit(bm, seq, n=None):
    """What the scheduler does: adopt the prefix hit, allocate the rest, mark it computed."""
    prefix = bm.match_prefix(seq)
    seq.num_computed_tokens = 0
    n = seq.num_tokens - len(prefix) * BS if n is None else n
    assert bm.allocate(seq, n, prefix)
    seq.num_computed_tokens = len(prefix) * BS + n
    bm.cache_full_blocks(seq)
    return len(prefix) * BS


def test_allocate_and_free_return_accounting_to_start():
    bm = BlockManager(10, BS)
    a, b = make_seq(range(10)), make_seq(range(100, 107))
    admit(bm, a)
    admit(bm, b)
    assert len(a.block_table) == 3 and len(b.block_table) == 2
    assert bm.num_free_blocks == 5
    bm.check_invariants([a, b])
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 10
    bm.check_invariants([])


def test_allocation_is_all_or_nothing():
    bm = BlockManager(3, BS)
    a = make_seq(range(9))
    assert not bm.allocate(a, 13)
    assert a.block_table == [] and bm.num_free_blocks == 3
    assert bm.allocate(a, 9)
    assert len(a.block_table) == 3
    a.num_computed_tokens = 9
    assert bm.allocate(a, 3)  # 12 tokens still fit in 3 blocks
    assert not bm.allocate(a, 4)
    assert len(a.block_table) == 3


def test_prefix_hit_is_block_aligned_and_leaves_a_token_to_compute():
    bm = BlockManager(20, BS)
    first = make_seq(range(11))  # 2 full blocks + 3 tokens
    assert admit(bm, first) == 0
    second = make_seq(list(range(10)) + [99, 98])  # shares 10 tokens -> 2 full blocks
    assert admit(bm, second) == 8
    assert second.block_table[:2] == first.block_table[:2]
    assert bm.blocks[first.block_table[0]].ref_count == 2
    exact = make_seq(range(8))  # whole prompt cached: the last block is recomputed
    assert admit(bm, exact) == 4
    bm.check_invariants([first, second, exact])


def test_different_salt_never_shares():
    bm = BlockManager(20, BS)
    admit(bm, make_seq(range(12), salt="tenant-a"))
    assert admit(bm, make_seq(range(12), salt="tenant-b")) == 0
    assert admit(bm, make_seq(range(12))) == 0
    assert admit(bm, make_seq(range(12), salt="tenant-a")) == 8


def test_freed_blocks_stay_cached_until_evicted_lru():
    bm = BlockManager(4, BS)
    a = make_seq(range(9))  # 3 blocks, 2 full
    admit(bm, a)
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    again = make_seq(range(9))
    assert admit(bm, again) == 8  # reuses the evictable blocks
    bm.free(again)
    # A big unrelated request needs every block: the cached ones are evicted.
    big = make_seq(range(500, 516))
    assert admit(bm, big) == 0
    assert bm.num_cached_blocks == 4  # only big's own full blocks, registered after compute
    bm.free(big)
    last = make_seq(range(9))
    assert admit(bm, last) == 0
    bm.check_invariants([last])


def test_lru_evicts_the_tail_of_a_prefix_first():
    bm = BlockManager(4, BS)
    a = make_seq(range(13))  # 3 full blocks + 1 partial: all 4 blocks
    admit(bm, a)
    bm.free(a)
    other = make_seq(range(1000, 1007))  # 2 blocks: a's partial one + one evicted cached block
    admit(bm, other)
    bm.free(other)
    # The evicted block was the tail of a's prefix: the first two blocks still hit.
    assert admit(bm, make_seq(range(13))) == 8


def test_duplicate_content_computed_twice_keeps_one_entry():
    bm = BlockManager(10, BS)
    a, b = make_seq(range(8), rid="a"), make_seq(range(8), rid="b")
    for s in (a, b):  # both allocated before either is computed: no hit
        assert bm.allocate(s, 8)
    for s in (a, b):
        s.num_computed_tokens = 8
        bm.cache_full_blocks(s)
    assert bm.num_cached_blocks == 2
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 10
    bm.check_invariants([])


def test_hit_counters_and_disabled_cache():
    bm = BlockManager(10, BS)
    bm.record_query(query_tokens=10, hit_tokens=4)
    assert bm.hit_rate == pytest.approx(0.4)
    off = BlockManager(10, BS, enable_prefix_caching=False)
    admit(off, make_seq(range(12)))
    assert admit(off, make_seq(range(12))) == 0 and off.num_cached_blocks == 0


def test_collision_guard_compares_tokens():
    bm = BlockManager(10, BS)
    a = make_seq(range(9))
    admit(bm, a)
    # Forge a colliding registration: same key, different content must not be served.
    b = make_seq([7, 7, 7, 7, 7])
    bm._extend_hashes(b, 1)
    key = ("", b.block_hashes[0])
    bm._cached[key] = a.block_table[0]
    assert bm.match_prefix(b) == []

"""Paged KV block allocation with automatic prefix caching.

Blocks hold `block_size` tokens. A FULL block whose K/V have been computed is
registered in the prefix cache under (cache_salt, chain hash), the chain hash
covering every token from the start of the sequence to the end of the block,
so equal keys mean equal prefixes. Different salts never share a block.

Reference counts track how many sequences use a block. A block whose count
drops to zero keeps its cached content and joins an LRU list of evictable
blocks; it is reused by a later prefix hit, or evicted (its key dropped) when
a fresh block is needed and no never-cached block is left. Free-block
accounting counts both kinds as free, so it returns to its starting value once
every request has finished or been aborted.

Sliding window (`window` > 0, given only when EVERY layer is local, e.g. Mistral's `sliding_window`): a query
at position p reads keys p - window + 1 .. p only, so once a sequence's next query starts at position c, its
blocks lying wholly before c - window are never read again. They are given back as it advances
(`release_outside_window`, called by the scheduler before it grows the sequence), one block later than
strictly needed, to the same place as a finished sequence's blocks: a full cached block stays hit-able by a
later prefix. The table keeps its length (logical block i stays at index i) and the released entries point at
the null block, NULL_BLOCK, reserved for this: never written (no slot maps there) and never read unmasked (every
attention kernel starts at the window or masks what lies before it; the gathering reference paths read the
zeros there and mask them). A prefix-cache hit adopts only the blocks its first computed token can see.
A sequence then holds at most `peak_blocks`: its window, its prefill chunk and two blocks.
A model with any global layer (Gemma 3) frees nothing: its global layers read every position. vLLM's hybrid
allocator keeps one block table per layer group for that (freeing the local layers' blocks only), a larger
change left out here.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from inference.engine.sequence import Sequence

NULL_BLOCK = 0  # with a window: reserved; the table entry of every released block


def peak_blocks(num_tokens: int, *, block_size: int, window: int = 0, chunk: int | None = None) -> int:
    """The most blocks a sequence of `num_tokens` holds at once, its prompt computed in chunks of at most `chunk`
    tokens. With a window: a step from position c holds blocks ceil((c + n) / bs) less the
    (c - window) // bs - 1 released, at most ceil((window + n) / bs) + 2."""
    total = -(-num_tokens // block_size)
    if not window:
        return total
    chunk = num_tokens if chunk is None else min(chunk, num_tokens)
    return min(total, -(-(window + chunk) // block_size) + 2)


class Block:
    __slots__ = ("block_id", "ref_count", "key", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.key: tuple[str, int] | None = None  # set while registered in the prefix cache
        self.token_ids: tuple[int, ...] = ()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 window: int = 0) -> None:
        """`window`: the sliding window of a model whose every layer is local (0: keep every block)."""
        reserved = 1 if window else 0  # the null block
        if num_blocks < 1 + reserved:
            raise ValueError("num_blocks must be positive" + " and hold the null block" * reserved)
        self.num_blocks = num_blocks
        self.capacity = num_blocks - reserved  # blocks sequences can hold
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.window = window
        self._null = NULL_BLOCK if window else -1  # -1: no table entry is null
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free_ids: deque[int] = deque(range(reserved, num_blocks))  # hold no cached content
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref 0 but cached; oldest first
        self._cached: dict[tuple[str, int], int] = {}  # key -> block id
        self.query_tokens = 0
        self.hit_tokens = 0

    # ---- accounting -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free_ids) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.capacity

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def peak_blocks(self, num_tokens: int, chunk: int | None = None) -> int:
        """The most blocks a sequence of `num_tokens` holds at once (module's `peak_blocks`)."""
        return peak_blocks(num_tokens, block_size=self.block_size, window=self.window, chunk=chunk)

    def record_query(self, *, query_tokens: int, hit_tokens: int) -> None:
        self.query_tokens += query_tokens
        self.hit_tokens += hit_tokens

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    # ---- prefix cache -----------------------------------------------------------------------
    def _extend_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        hashes, bs, tokens = seq.block_hashes, self.block_size, seq.token_ids
        prev = hashes[-1] if hashes else 0
        for i in range(len(hashes), num_full_blocks):
            prev = hash((prev, tuple(tokens[i * bs:(i + 1) * bs])))
            hashes.append(prev)

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix of `seq` (nothing is taken yet).

        At least one token is always left to compute: its logits start generation.
        """
        if not self.enable_prefix_caching:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        self._extend_hashes(seq, max_blocks)
        bs, salt, hits = self.block_size, seq.cache_salt, []
        for i in range(max_blocks):
            block_id = self._cached.get((salt, seq.block_hashes[i]))
            if block_id is None:
                break
            if self.blocks[block_id].token_ids != tuple(seq.token_ids[i * bs:(i + 1) * bs]):
                break  # hash collision: never serve another prefix's K/V
            hits.append(block_id)
        return hits

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register `seq`'s newly computed full blocks so later requests can share them."""
        if not self.enable_prefix_caching:
            return
        # a pending token (async scheduling) is computed before it is known: its block waits for it
        num_full = min(min(seq.num_computed_tokens, len(seq.token_ids)) // self.block_size, len(seq.block_table))
        start = seq.num_registered_blocks
        if num_full <= start:
            return
        self._extend_hashes(seq, num_full)
        bs, salt = self.block_size, seq.cache_salt
        for i in range(start, num_full):
            block = self.blocks[seq.block_table[i]]
            if block.key is None:
                key = (salt, seq.block_hashes[i])
                if key not in self._cached:  # a twin computed concurrently keeps the entry
                    self._cached[key] = block.block_id
                    block.key = key
                    block.token_ids = tuple(seq.token_ids[i * bs:(i + 1) * bs])
        seq.num_registered_blocks = num_full

    def reset_prefix_cache(self) -> None:
        """Forget every unreferenced cached block (referenced ones stay registered)."""
        while self._evictable:
            block_id, _ = self._evictable.popitem(last=False)
            self._uncache(self.blocks[block_id])
            self._free_ids.append(block_id)

    # ---- allocation -------------------------------------------------------------------------
    def _uncache(self, block: Block) -> None:
        if block.key is not None:
            del self._cached[block.key]
            block.key = None
            block.token_ids = ()

    def _take_fresh(self) -> int:
        if self._free_ids:
            block_id = self._free_ids.popleft()
        else:
            block_id, _ = self._evictable.popitem(last=False)  # least recently used
            self._uncache(self.blocks[block_id])
        self.blocks[block_id].ref_count = 1
        return block_id

    def can_allocate(self, seq: Sequence, num_new_tokens: int, prefix_blocks: list[int] = ()) -> bool:
        needed, taken_free = self._needs(seq, num_new_tokens, prefix_blocks)
        return needed + taken_free <= self.num_free_blocks

    def _needs(self, seq: Sequence, num_new_tokens: int, prefix_blocks) -> tuple[int, int]:
        """(fresh blocks, free cached blocks adopted) for `num_new_tokens` more. The table's length counts
        released blocks too (logical indices), so only blocks past its end are fresh."""
        computed = seq.num_computed_tokens + len(prefix_blocks) * self.block_size
        have = len(seq.block_table) + len(prefix_blocks)
        needed = max(0, self.blocks_needed(computed + num_new_tokens) - have)
        skip = self._releasable(len(prefix_blocks) * self.block_size)
        taken_free = sum(1 for b in prefix_blocks[skip:] if self.blocks[b].ref_count == 0)
        return needed, taken_free

    def _releasable(self, first_pos: int) -> int:
        """How many leading blocks no query from `first_pos` on reads: those wholly before first_pos - window
        (keys from first_pos - window + 1 are read), less one for safety."""
        if not self.window:
            return 0
        return max(0, (first_pos - self.window) // self.block_size - 1)

    def release_outside_window(self, seq: Sequence) -> int:
        """Give back `seq`'s blocks that its next query (at num_computed_tokens) and later ones cannot see;
        -> how many. Their entries become NULL_BLOCK in a new list (the model runner's copy of a table
        follows appends only). With the prefix cache, only blocks already offered to it are released.
        A step still in flight on the device (async scheduling) may read a released block: a later step
        that writes it runs after it in stream order."""
        table = seq.block_table
        upto = min(self._releasable(seq.num_computed_tokens), len(table))
        if self.enable_prefix_caching:
            upto = min(upto, seq.num_registered_blocks)
        i = upto - 1
        if i < 0 or table[i] == self._null:
            return 0  # nothing new (most steps)
        table = list(table)
        released = 0
        while i >= 0 and table[i] != self._null:  # released entries form a prefix of the table
            self._unref(table[i])
            table[i] = self._null
            released += 1
            i -= 1
        seq.block_table = table
        return released

    def allocate(self, seq: Sequence, num_new_tokens: int, prefix_blocks: list[int] = ()) -> bool:
        """Give `seq` room for `num_new_tokens` more tokens, first adopting `prefix_blocks`
        (a prefix hit, only for a sequence holding no blocks). All or nothing."""
        if not prefix_blocks and seq.num_computed_tokens + num_new_tokens <= len(seq.block_table) * self.block_size:
            return True  # fits the blocks it holds (most decode steps)
        if prefix_blocks and seq.block_table:
            raise ValueError("prefix blocks are only adopted by a sequence without blocks")
        needed, taken_free = self._needs(seq, num_new_tokens, prefix_blocks)
        if needed + taken_free > self.num_free_blocks:
            return False
        skip = self._releasable(len(prefix_blocks) * self.block_size)  # a window: not seen from the hit's end
        seq.block_table.extend([self._null] * skip)
        for block_id in prefix_blocks[skip:]:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._evictable[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
        if prefix_blocks:
            seq.num_registered_blocks = len(prefix_blocks)
        for _ in range(needed):
            seq.block_table.append(self._take_fresh())
        return True

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s references. Tail blocks are freed first so that the LRU evicts
        the ends of prefixes before their (more shareable) beginnings."""
        null = self._null
        for block_id in reversed(seq.block_table):
            if block_id != null:
                self._unref(block_id)
        seq.block_table = []
        seq.num_registered_blocks = 0

    def _unref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.key is not None:
                self._evictable[block_id] = None
            else:
                self._free_ids.append(block_id)

    def check_invariants(self, live: list[Sequence]) -> None:
        """Assert the bookkeeping is consistent with the live sequences (for tests)."""
        refs = [0] * self.num_blocks
        for seq in live:
            for block_id in seq.block_table:
                if block_id != self._null:
                    refs[block_id] += 1
        for block in self.blocks:
            assert block.ref_count == refs[block.block_id], (block.block_id, block.ref_count, refs[block.block_id])
        free, evict = set(self._free_ids), set(self._evictable)
        assert len(free) == len(self._free_ids) and not free & evict
        if self.window:  # the null block: in no pool, never cached
            null = self.blocks[NULL_BLOCK]
            assert NULL_BLOCK not in free | evict and null.ref_count == 0 and null.key is None
        for block in self.blocks[self.num_blocks - self.capacity:]:
            in_pool = block.block_id in free or block.block_id in evict
            assert in_pool == (block.ref_count == 0), block.block_id
            assert (block.block_id in evict) <= (block.key is not None)
            if block.key is not None:
                assert self._cached[block.key] == block.block_id
        assert len(self._cached) == sum(b.key is not None for b in self.blocks)

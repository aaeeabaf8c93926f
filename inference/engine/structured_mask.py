"""The grammar's token mask on a step's logits (the sampler's first filter for rows with a matcher).

Per step: llguidance fills one bitmask row (32 tokens per int32, bit j of word w = token 32w + j) per
grammar row, in parallel on its own threads (`LLExecutor`, the GIL dropped); the rows go to the logits'
device (pinned and asynchronous on CUDA), where each mask byte picks its 8 tokens' biases (0 or -inf) from
a 256 x 8 table, added to the logits: every token outside the mask gets -inf. llguidance's own
`apply_token_bitmask_inplace` is a torch.compile'd function: a C++ toolchain and seconds of compile at the
first masked step, on the CPU too; the table lookup is plain torch and the same on both devices.

A row whose matcher is in error (it cannot happen through the mask; a bug or a parser limit) would be all
-inf: it gets EOS alone, which its matcher then refuses, so the request ends with "error" at `take`.
"""

from __future__ import annotations

import os

import torch

_NEG_INF = -float("inf")


class GrammarMasker:
    """Fills and applies the masks of a step's grammar rows; built by the sampler at its first such row."""

    def __init__(self, eos_token_id: int | None, threads: int | None = None) -> None:
        import llguidance
        import llguidance.torch as lt

        self._fill = lt.fill_next_token_bitmask_par
        self.executor = llguidance.LLExecutor(num_threads=threads or max(1, min(8, os.cpu_count() or 1)))
        self.eos_token_id = eos_token_id
        self._tables: dict[torch.device, torch.Tensor] = {}

    def _table(self, device: torch.device) -> torch.Tensor:
        """table[b, k] = 0 where bit k of byte b is set, else -inf (little-endian words: byte 4w + k // 8 holds
        token 32w + k)."""
        table = self._tables.get(device)
        if table is None:
            bits = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).bool()
            table = torch.zeros(256, 8).masked_fill_(~bits, _NEG_INF).to(device)
            self._tables[device] = table
        return table

    def bitmask(self, seqs, rows: list[int], vocab: int, pinned: bool = False) -> torch.Tensor:
        """The CPU bitmask of `rows` (their order), filled by their matchers."""
        mask = torch.empty((len(rows), (vocab + 31) // 32), dtype=torch.int32, pin_memory=pinned)
        self._fill(self.executor, [(seqs[i].grammar.matcher, j) for j, i in enumerate(rows)], mask)
        dead = (mask == 0).all(dim=1)
        if bool(dead.any()) and self.eos_token_id is not None:
            eos, bit = self.eos_token_id, 1 << (self.eos_token_id % 32)
            mask[dead] = 0
            mask[dead, eos // 32] = bit - (1 << 32) if bit >= 1 << 31 else bit  # as a signed int32
        return mask

    def apply(self, logits: torch.Tensor, seqs, rows: list[int]) -> None:
        """Mask `logits` (in place) in `rows`, the rows whose sequence has a grammar: each row gets its bias
        of 0 (allowed) or -inf added, one table lookup per mask byte (half the time of unpacking bits and
        a masked fill). The other rows are not touched."""
        n, vocab = logits.shape
        dev = logits.device
        mask = self.bitmask(seqs, rows, vocab, pinned=dev.type == "cuda")
        if dev.type == "cuda":
            mask = mask.to(dev, non_blocking=True)
        table = self._table(dev).to(logits.dtype)
        bias = table.index_select(0, mask.view(torch.uint8).view(-1).int()).view(len(rows), -1)[:, :vocab]
        if len(rows) == n:
            logits.add_(bias)
            return
        idx = torch.tensor(rows, device="cpu")
        idx = idx.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else idx
        logits.index_add_(0, idx, bias)

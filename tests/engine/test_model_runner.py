"""The model runner's step inputs: token ids, positions, slots, block tables, sampling rows."""

import pytest
import torch

from inference.engine.model_runner import ModelRunner
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence

BS = 4


def runner():
    r = ModelRunner.__new__(ModelRunner)  # inputs only: no model, no KV cache
    r.block_size, r.device, r.split_mixed = BS, torch.device("cpu"), True
    return r


def seq(tokens, table, computed):
    s = Sequence(f"s{len(tokens)}", tokens, SamplingParams(), max_tokens=4)
    s.block_table, s.num_computed_tokens = table, computed
    return s


def test_mixed_batch_inputs():
    decode = seq(list(range(10, 17)), [5, 2], 6)  # 7 tokens, 6 cached: decodes position 6
    chunk = seq(list(range(100, 110)), [7, 1, 9], 2)  # computes positions 2..7 of 10: no sample
    tail = seq(list(range(200, 205)), [3, 4], 3)  # computes 3..4: reaches the end, samples
    ids, pos, meta, rows, sampling = runner().prepare([decode, chunk, tail], [1, 6, 2])
    assert ids.tolist() == [16, 102, 103, 104, 105, 106, 107, 203, 204]
    assert pos.tolist() == [6, 2, 3, 4, 5, 6, 7, 3, 4]
    # slot = block * 4 + offset: pos 6 of [5, 2] -> block 2 offset 2 = 10; pos 2..7 of [7, 1, 9] ...
    assert meta.slot_mapping.tolist() == [10, 30, 31, 4, 5, 6, 7, 15, 16]
    assert meta.query_start_loc.tolist() == [0, 1, 7, 9]
    assert meta.seq_lens.tolist() == [7, 8, 5]
    assert meta.block_tables.tolist() == [[5, 2, 0], [7, 1, 9], [3, 4, 0]]
    assert meta.block_tables.dtype == torch.int32 and meta.slot_mapping.dtype == torch.int64
    assert (meta.max_query_len, meta.max_seq_len, meta.decode_only, meta.num_decodes) == (6, 8, False, 1)
    assert rows.tolist() == [0, 8] and sampling == [decode, tail]


def test_a_mixed_step_lists_its_decodes_first():
    """The attention layers send the first `num_decodes` sequences to the decode kernel: one-token sequences
    move to the front (in the scheduler's order), every row's inputs and the sampling order follow them."""
    chunk = seq(list(range(100, 110)), [7, 1, 9], 2)  # positions 2..7: no sample
    first = seq(list(range(10, 17)), [5, 2], 6)  # decodes position 6
    tail = seq(list(range(200, 205)), [3, 4], 3)  # positions 3..4: samples
    second = seq([1, 2, 3], [6], 2)  # decodes position 2
    ids, pos, meta, rows, sampling = runner().prepare([chunk, first, tail, second], [6, 1, 2, 1])
    assert ids.tolist() == [16, 3, 102, 103, 104, 105, 106, 107, 203, 204]
    assert pos.tolist() == [6, 2, 2, 3, 4, 5, 6, 7, 3, 4]
    assert meta.slot_mapping.tolist() == [10, 26, 30, 31, 4, 5, 6, 7, 15, 16]
    assert meta.query_start_loc.tolist() == [0, 1, 2, 8, 10] and meta.seq_lens.tolist() == [7, 3, 8, 5]
    assert meta.block_tables.tolist() == [[5, 2, 0], [6, 0, 0], [7, 1, 9], [3, 4, 0]]
    assert (meta.num_decodes, meta.decode_only) == (2, False)
    assert rows.tolist() == [0, 1, 9] and sampling == [first, second, tail]

    r = runner()
    r.split_mixed = False  # the peer: the scheduler's order, every row through the prefill kernel
    ids, _, meta, rows, sampling = r.prepare([chunk, first, tail, second], [6, 1, 2, 1])
    assert ids.tolist() == [102, 103, 104, 105, 106, 107, 16, 203, 204, 3]
    assert meta.num_decodes == 0 and rows.tolist() == [6, 8, 9] and sampling == [first, tail, second]


def test_decode_only_batch():
    a, b = seq([1, 2, 3, 4, 5], [0, 1], 4), seq([6, 7], [2], 1)
    _, pos, meta, rows, _ = runner().prepare([a, b], [1, 1])
    assert meta.decode_only and meta.num_decodes == 2 and pos.tolist() == [4, 1] and rows.tolist() == [0, 1]
    assert meta.slot_mapping.tolist() == [4, 9]


def test_a_pending_token_is_taken_from_the_step_in_flight():
    """async scheduling: a sequence whose last sampled token is still on the device (pending) gets it
    as its input from that step's sampled ids, row `pending_row`; the others' inputs are as usual."""
    a = seq([1, 2, 3, 4, 5], [0, 1], 5)  # 5 tokens computed + 1 pending: decodes position 5
    a.pending, a.pending_row = 1, 2
    b = seq([6, 7, 8], [2], 2)  # an ordinary decode of its known last token
    c = seq([9, 10], [3], 2)
    c.pending, c.pending_row = 1, 0
    prev_tokens = torch.tensor([70, 71, 72])
    ids, pos, meta, rows, sampling = runner().prepare([a, b, c], [1, 1, 1], prev_tokens)
    assert ids.tolist() == [72, 8, 70]
    assert pos.tolist() == [5, 2, 2] and meta.slot_mapping.tolist() == [5, 10, 14]
    assert meta.seq_lens.tolist() == [6, 3, 3] and rows.tolist() == [0, 1, 2] and sampling == [a, b, c]
    with pytest.raises(ValueError, match="no prev_tokens"):
        runner().prepare([a], [1])

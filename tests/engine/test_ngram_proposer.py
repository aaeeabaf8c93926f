"""N-gram prompt lookup and the per-sequence speculation policy (inference.engine.ngram_proposer)."""

import pytest

from inference.engine import SamplingParams
from inference.engine.ngram_proposer import Speculator, ngram_lookup
from inference.engine.sequence import Sequence


def test_the_most_recent_earlier_occurrence_of_the_suffix_gives_the_drafts():
    tokens = [1, 2, 3, 10, 11, 9, 2, 3, 20, 21, 22, 5, 2, 3]
    assert ngram_lookup(tokens, min_n=2, max_n=2, k=3) == [20, 21, 22]  # [2, 3] last seen before 20


def test_the_longest_recurring_suffix_wins():
    tokens = [7, 2, 3, 40, 41, 1, 7, 2, 3, 50, 51, 9, 7, 2, 3]
    assert ngram_lookup(tokens, min_n=2, max_n=3, k=2) == [50, 51]
    tokens = [8, 2, 3, 40, 41, 1, 7, 2, 3, 50, 51, 9, 8, 2, 3]  # the 3-gram [8, 2, 3] only recurs at the start
    assert ngram_lookup(tokens, min_n=2, max_n=3, k=2) == [40, 41]


def test_drafts_stop_at_the_end_of_the_known_tokens():
    tokens = [4, 5, 6, 4, 5]
    assert ngram_lookup(tokens, min_n=2, max_n=3, k=8) == [6, 4, 5]


def test_no_recurrence_no_drafts_and_the_suffix_does_not_match_itself():
    assert ngram_lookup([1, 2, 3, 4, 5], min_n=1, max_n=3, k=4) == []
    assert ngram_lookup([9, 9], min_n=1, max_n=1, k=4) == [9]
    assert ngram_lookup([9], min_n=1, max_n=1, k=4) == []
    assert ngram_lookup([1, 2, 1, 2], min_n=2, max_n=2, k=0) == []


def test_a_byte_match_across_token_boundaries_is_not_a_match():
    # [256, 2] packs as 00 01 00 00 02 00 00 00: its bytes 1..4 are the token 0x02000001
    straddler = 0x02000001
    assert ngram_lookup([256, 2, 5, straddler], min_n=1, max_n=1, k=2) == []
    # the aligned occurrence at the start counts, the more recent straddling one does not
    assert ngram_lookup([straddler, 7, 256, 2, 5, straddler], min_n=1, max_n=1, k=2) == [7, 256]


def _seq(max_tokens=64, **sampling) -> Sequence:
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
    seq = Sequence("r", prompt, SamplingParams(max_tokens=max_tokens, **sampling), max_tokens=max_tokens)
    seq.num_computed_tokens = len(prompt) - 1
    return seq


def test_the_proposal_shrinks_with_refusals_and_rests_after_many():
    spec = Speculator(num_tokens=4)
    seq = _seq()
    assert spec.propose(seq, 100) == [8, 9, 5, 6]
    spec.record(seq, 4, 1)  # rate 0.625 -> ceil(4 * 0.625) = 3
    assert spec.propose(seq, 100) == [8, 9, 5]
    spec.record(seq, 3, 0)  # 0.3125: 2 drafts
    assert spec.propose(seq, 100) == [8, 9]
    spec.record(seq, 2, 0)
    spec.record(seq, 1, 0)  # below the rest threshold: the next few steps draft nothing
    assert [spec.propose(seq, 100) for _ in range(4)] == [[], [], [], []]
    assert spec.propose(seq, 100) == [8]  # then short drafts again
    assert spec.counters == {"spec_decode_num_drafts": 4, "spec_decode_num_draft_tokens": 10,
                             "spec_decode_num_accepted_tokens": 1}


def test_drafts_fit_the_budget_and_max_tokens():
    spec = Speculator(num_tokens=4)
    assert spec.propose(_seq(), 2) == [8, 9]
    seq = _seq(max_tokens=3)
    seq.output_token_ids = [1]
    assert spec.propose(seq, 100) == [8]  # 1 out, a draft and the token after it fill max_tokens = 3


@pytest.mark.parametrize("sampling", [dict(presence_penalty=0.5), dict(repetition_penalty=1.2),
                                      dict(min_tokens=2)])
def test_rows_that_depend_on_the_tokens_before_them_get_no_drafts(sampling):
    assert Speculator(num_tokens=4).propose(_seq(**sampling), 100) == []


def test_a_step_drafts_within_its_rows():
    spec = Speculator(num_tokens=4, max_rows=8)
    assert [spec.step_room(n) for n in (1, 7, 8, 9)] == [7, 1, 0, -1]

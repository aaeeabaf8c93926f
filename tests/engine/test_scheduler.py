"""Scheduler policy without a model: a fake step appends a deterministic token."""

from inference.engine.block_manager import BlockManager
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import Scheduler
from inference.engine.scheduler_policy import PriorityPolicy
from inference.engine.sequence import Sequence, SeqStatus

BS = 4


def make_scheduler(num_blocks=64, max_num_seqs=8, budget=32, aging=None, max_preemptions=2, caching=True,
                   background=None):
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=caching)
    policy = PriorityPolicy(aging_s=aging, max_preemptions=max_preemptions)
    return Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, policy=policy,
                     background_priority=background)


def make_seq(rid, n_prompt, max_tokens=4, priority=0, arrival=0.0, base=0):
    return Sequence(rid, [base + i for i in range(n_prompt)], SamplingParams(), max_tokens=max_tokens,
                    priority=priority, arrival_time=arrival)


def fake_step(sched, now=100.0):
    """One engine iteration: schedule, 'compute', sample a token where due, retire finished."""
    batch = sched.schedule(now=now)
    sched.postprocess(batch)
    sampled = []
    for seq in batch.seqs:
        if seq.num_computed_tokens == seq.num_tokens:
            seq.append_token(7000 + seq.num_output_tokens)
            sampled.append(seq.request_id)
            if seq.num_output_tokens >= seq.max_tokens:
                sched.finish(seq, "length")
    live = list(sched.requests.values())
    sched.bm.check_invariants(live)
    assert len(sched.running) <= sched.max_num_seqs
    return batch, sampled


def run_all(sched, max_steps=500):
    order, steps = [], 0
    while sched.has_unfinished():
        _, sampled = fake_step(sched)
        order.extend(sampled)
        steps += 1
        assert steps < max_steps, "no progress"
    return order


def test_chunked_prefill_mixed_with_decodes_respects_budget():
    sched = make_scheduler(budget=16)
    sched.add(make_seq("short", 3, max_tokens=10))
    batch, sampled = fake_step(sched)
    assert sampled == ["short"]
    sched.add(make_seq("long", 40, max_tokens=2, base=100))
    batch, sampled = fake_step(sched)
    assert dict(zip([s.request_id for s in batch.seqs], batch.num_new_tokens)) == {"short": 1, "long": 15}
    assert sampled == ["short"]  # "long" is mid-prefill: no token yet
    batch, _ = fake_step(sched)
    assert batch.num_tokens == 16
    batch, sampled = fake_step(sched)  # 15 + 15 + 10 = 40: long finishes its prefill
    assert batch.num_new_tokens[-1] == 10 and "long" in sampled


def test_cap_on_running_sequences_and_order_by_priority_then_arrival():
    sched = make_scheduler(max_num_seqs=2, budget=64)
    sched.add(make_seq("late-low", 4, priority=5, arrival=3.0))
    sched.add(make_seq("early-low", 4, priority=5, arrival=1.0, base=50))
    sched.add(make_seq("high", 4, priority=0, arrival=2.0, base=90))
    batch, _ = fake_step(sched)
    assert [s.request_id for s in batch.seqs] == ["high", "early-low"]
    assert [s.request_id for s in sched.waiting] == ["late-low"]


def test_everything_completes_and_blocks_return_under_memory_pressure():
    sched = make_scheduler(num_blocks=10, max_num_seqs=8, budget=32, caching=False)
    for i in range(6):
        sched.add(make_seq(f"r{i}", 9 + i, max_tokens=8, base=100 * i))
    start = sched.bm.num_free_blocks
    order = run_all(sched)
    assert sched.num_preemptions > 0
    assert len(order) == 6 * 8
    assert sched.bm.num_free_blocks == start


def test_preemption_picks_lowest_priority_latest_and_keeps_its_cached_blocks():
    sched = make_scheduler(num_blocks=8, budget=64)
    sched.add(make_seq("hi", 8, max_tokens=12, priority=0, arrival=1.0))
    sched.add(make_seq("lo-early", 8, max_tokens=12, priority=3, arrival=1.0, base=100))
    sched.add(make_seq("lo-late", 8, max_tokens=12, priority=3, arrival=2.0, base=200))
    preempted = []
    while sched.has_unfinished() and not preempted:
        batch, _ = fake_step(sched)
        preempted = [s.request_id for s in batch.preempted]
    assert preempted == ["lo-late"]
    victim = sched.requests["lo-late"]
    assert victim.status is SeqStatus.WAITING and victim.num_computed_tokens == 0 and victim.block_table == []
    assert len(sched.bm.match_prefix(victim)) >= 2  # its full blocks remain in the prefix cache
    run_all(sched)
    assert victim.cached_tokens == 0  # billing keeps the first admission's hit


def test_waiting_high_priority_preempts_when_seat_cap_is_full():
    sched = make_scheduler(max_num_seqs=2, budget=64)
    sched.add(make_seq("lo1", 4, max_tokens=50, priority=5, arrival=1.0))
    sched.add(make_seq("lo2", 4, max_tokens=50, priority=5, arrival=2.0, base=30))
    fake_step(sched)
    sched.add(make_seq("queued-lo", 4, max_tokens=50, priority=5, arrival=3.0, base=60))
    fake_step(sched)
    sched.add(make_seq("vip", 4, max_tokens=3, priority=0, arrival=4.0, base=90))
    batch, sampled = fake_step(sched)
    assert "vip" in sampled
    assert [s.request_id for s in batch.preempted] == ["lo2"]
    assert sched.requests["queued-lo"].num_output_tokens == 0
    # Equal priority never preempts.
    sched2 = make_scheduler(max_num_seqs=1)
    sched2.add(make_seq("a", 4, max_tokens=50, priority=1, arrival=1.0))
    fake_step(sched2)
    sched2.add(make_seq("b", 4, max_tokens=5, priority=1, arrival=2.0))
    batch, _ = fake_step(sched2)
    assert not batch.preempted and [s.request_id for s in batch.seqs] == ["a"]


def test_preemption_bound_prevents_starvation():
    sched = make_scheduler(max_num_seqs=1, budget=64, max_preemptions=2)
    sched.add(make_seq("victim", 4, max_tokens=30, priority=9, arrival=0.0))
    fake_step(sched)
    victim = sched.requests["victim"]
    for k in range(4):  # a stream of high-priority arrivals, each short
        sched.add(make_seq(f"vip{k}", 4, max_tokens=2, priority=0, arrival=1.0 + k, base=100 * (k + 1)))
        for _ in range(3):
            fake_step(sched)
        if k < 2:
            assert victim.num_preemptions == k + 1
    assert victim.num_preemptions == 2
    assert victim.status is SeqStatus.RUNNING  # protected now: later VIPs wait for it
    assert sched.requests["vip2"].status is SeqStatus.WAITING
    run_all(sched)


def test_aging_lifts_a_long_waiting_request():
    policy = PriorityPolicy(aging_s=10.0, max_preemptions=2)
    old = make_seq("old", 4, priority=5, arrival=0.0)
    new = make_seq("new", 4, priority=2, arrival=95.0)
    assert policy.effective_priority(old, 100.0) < policy.effective_priority(new, 100.0)
    sched = make_scheduler(max_num_seqs=1, aging=10.0)
    sched.add(new)
    sched.add(old)
    batch = sched.schedule(now=100.0)
    assert [s.request_id for s in batch.seqs] == ["old"]


def test_abort_frees_at_once_from_running_and_waiting():
    sched = make_scheduler(max_num_seqs=1)
    start = sched.bm.num_free_blocks
    sched.add(make_seq("run", 10, max_tokens=50))
    sched.add(make_seq("wait", 10, max_tokens=50, base=40))
    fake_step(sched)
    assert sched.bm.num_free_blocks < start
    assert sched.abort("run").finish_reason == "abort"
    assert sched.bm.num_free_blocks == start
    assert sched.abort("wait").status is SeqStatus.FINISHED
    assert sched.abort("missing") is None
    assert not sched.has_unfinished()


def test_prefix_hit_skips_cached_tokens_and_is_counted():
    sched = make_scheduler(budget=64)
    sched.add(make_seq("a", 13, max_tokens=1))
    run_all(sched)
    sched.add(make_seq("b", 13, max_tokens=1))
    batch, _ = fake_step(sched)
    assert batch.num_new_tokens == [1] and sched.requests.get("b") is None
    assert sched.bm.hit_tokens == 12 and sched.bm.query_tokens == 26


def test_a_pending_token_is_scheduled_as_a_decode_unless_it_is_the_last():
    """async scheduling: a sequence whose sampled token is still in flight decodes that token next
    step (one new token past what it knows); one whose pending token is its max_tokens-th is not
    scheduled (its step would be wasted); a prefix-cache block waits for its pending token."""
    sched = make_scheduler(budget=32)
    a, b = make_seq("a", 7, max_tokens=3), make_seq("b", 5, max_tokens=1)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule(now=100.0)
    sched.postprocess(batch)
    assert batch.num_new_tokens == [7, 5]
    a.pending = b.pending = 1  # both sampled their first token on the device, not read back yet
    assert a.samples_after(1)
    batch = sched.schedule(now=100.0)
    assert batch.seqs == [a] and batch.num_new_tokens == [1]
    sched.postprocess(batch)
    assert a.num_computed_tokens == 8 == a.num_tokens + 1
    assert a.num_registered_blocks == 1  # positions 4..7 form a full block, but token 7 is not known
    a.pending = 0  # the token is read back (the engine's land)
    a.append_token(7000)
    sched.bm.cache_full_blocks(a)
    assert a.num_registered_blocks == 2
    sched.bm.check_invariants([a, b])


def test_background_rows_sit_out_a_foreground_prefill_and_run_in_decode_steps():
    sched = make_scheduler(budget=32, background=1000)
    for n in range(3):
        sched.add(make_seq(f"bg{n}", 3, max_tokens=20, priority=1000, base=10 * n))
    batch, sampled = fake_step(sched)
    assert sorted(sampled) == ["bg0", "bg1", "bg2"]  # alone, background work runs
    batch, _ = fake_step(sched)
    assert len(batch.seqs) == 3  # decode-only steps run every row
    sched.add(make_seq("live", 9, max_tokens=3, priority=2, base=500))
    batch, sampled = fake_step(sched)
    assert [s.request_id for s in batch.seqs] == ["live"] and sampled == ["live"]  # its prefill runs alone
    batch, sampled = fake_step(sched)  # then it decodes beside them
    assert sorted(s.request_id for s in batch.seqs) == ["bg0", "bg1", "bg2", "live"]
    outputs = {seq.request_id: seq for seq in sched.requests.values()}
    assert all(outputs[f"bg{n}"].num_output_tokens == 3 for n in range(3))  # one step skipped, none lost
    assert run_all(sched).count("live") == 1


def test_without_a_background_priority_every_row_runs_with_a_prefill():
    sched = make_scheduler(budget=32)
    sched.add(make_seq("bg", 3, max_tokens=20, priority=1000))
    fake_step(sched)
    sched.add(make_seq("live", 9, max_tokens=3, priority=2, base=500))
    batch, _ = fake_step(sched)
    assert sorted(s.request_id for s in batch.seqs) == ["bg", "live"]

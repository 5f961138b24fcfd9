"""Scheduler logic without a model: budgets, chunked prefill, admission, preemption."""
from tightfit.config import SchedulerConfig
from tightfit.engine.block_pool import BlockPool
from tightfit.engine.request import Sequence, Status
from tightfit.engine.sampling_params import SamplingParams
from tightfit.engine.scheduler import FCFSPolicy, Scheduler


def make(n_blocks=16, bs=4, budget=8, max_seqs=8, policy=None):
    pool = BlockPool(n_blocks, bs)
    return Scheduler(SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget),
                     pool, policy), pool


def seq(rid, n, prio=0, idx=0):
    return Sequence(rid, list(range(100 * idx, 100 * idx + n)), SamplingParams(), prio, idx)


def run_step(sched, sampled_token=1):
    out = sched.schedule()
    sched.after_step(out)
    for s in out.scheduled:
        if s.samples:
            s.seq.token_ids.append(sampled_token)
    return out


def test_long_prompt_is_chunked_and_decodes_keep_running():
    sched, _ = make(budget=8)
    a = seq("a", 3, idx=0)
    sched.add(a)
    out = run_step(sched)
    assert [(s.seq.request_id, s.num_new_tokens, s.start) for s in out.scheduled] == [("a", 3, 0)]
    b = seq("b", 20, idx=1)
    sched.add(b)
    out = run_step(sched)
    # a decodes one token; b gets the rest of the budget (7) as its first chunk
    assert [(s.seq.request_id, s.num_new_tokens, s.start) for s in out.scheduled] == [
        ("a", 1, 3), ("b", 7, 0)]
    assert not out.scheduled[1].samples
    out = run_step(sched)
    assert [(s.seq.request_id, s.num_new_tokens, s.start) for s in out.scheduled] == [
        ("a", 1, 4), ("b", 7, 7)]
    out = run_step(sched)
    assert [(s.seq.request_id, s.num_new_tokens, s.start) for s in out.scheduled] == [
        ("a", 1, 5), ("b", 6, 14)]
    assert out.scheduled[1].samples


def test_max_num_seqs_limits_admission():
    sched, _ = make(budget=64, max_seqs=2)
    for i in range(3):
        sched.add(seq(str(i), 2, idx=i))
    out = run_step(sched)
    assert [s.seq.request_id for s in out.scheduled] == ["0", "1"]
    assert [s.request_id for s in sched.waiting] == ["2"]


def test_block_tables_grow_per_block():
    sched, pool = make(bs=4, budget=64)
    a = seq("a", 4)
    sched.add(a)
    run_step(sched)
    assert a.block_table == [0]
    run_step(sched)  # token 5 needs a second block
    assert a.block_table == [0, 1]


def test_preempts_lowest_priority_newest_when_out_of_blocks():
    sched, pool = make(n_blocks=4, bs=4, budget=64)
    hi = seq("hi", 3, prio=0, idx=0)
    lo = seq("lo", 12, prio=5, idx=1)
    sched.add(hi)
    sched.add(lo)
    run_step(sched)  # hi's first prefill runs alone: lo's prefill does not ride along
    assert hi.block_table == [0] and lo.status is Status.WAITING
    run_step(sched)  # hi decodes within its block; lo takes the other three
    assert (hi.block_table, lo.block_table) == ([0], [1, 2, 3])
    run_step(sched)  # hi's 5th token needs a block: only lo can give one
    assert len(hi.block_table) == 2
    assert lo.status is Status.WAITING and lo.block_table == [] and lo.num_computed_tokens == 0
    assert sched.num_preemptions == 1 and lo.num_preemptions == 1


def _plan(out):
    return [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled]


def test_background_prefill_shares_a_small_chunk_per_step():
    pool = BlockPool(64, 4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, background_chunk_tokens=16),
                      pool)
    sched.add(seq("a", 40, prio=3, idx=0))
    sched.add(seq("b", 40, prio=3, idx=1))
    assert _plan(run_step(sched)) == [("a", 16)]  # 16 background prefill tokens in all
    assert _plan(run_step(sched)) == [("a", 16)]
    # foreground work keeps the whole budget
    fg, _ = make(budget=64)
    fg.add(seq("c", 40, prio=0, idx=0))
    assert _plan(run_step(fg)) == [("c", 40)]


def test_waiting_important_request_goes_before_running_background_prefill():
    pool = BlockPool(64, 4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, background_chunk_tokens=32),
                      pool)
    lo = seq("lo", 100, prio=5, idx=0)
    sched.add(lo)
    assert _plan(run_step(sched)) == [("lo", 32)]
    sched.add(seq("hi", 4, prio=0, idx=1))
    assert _plan(run_step(sched)) == [("hi", 4)]  # lo's next chunk is deferred, not mixed in
    assert _plan(run_step(sched)) == [("hi", 1), ("lo", 32)]
    assert lo.num_computed_tokens == 64 and lo.num_preemptions == 0


def test_first_token_step_of_important_request_skips_less_important_decodes():
    sched, _ = make(budget=64)
    lo = seq("lo", 4, prio=5, idx=0)
    sched.add(lo)
    run_step(sched)
    assert _plan(run_step(sched)) == [("lo", 1)]
    sched.add(seq("hi", 6, prio=0, idx=1))
    assert _plan(run_step(sched)) == [("hi", 6)]  # lo sits out this one step
    assert _plan(run_step(sched)) == [("hi", 1), ("lo", 1)]
    # equal priorities: nobody sits out
    eq, _ = make(budget=64)
    eq.add(seq("a", 4, idx=0))
    run_step(eq)
    eq.add(seq("b", 6, idx=1))
    assert _plan(run_step(eq)) == [("a", 1), ("b", 6)]


def test_priority_order_on_admission_and_fcfs_alternative():
    sched, _ = make(budget=64, max_seqs=1)
    sched.add(seq("late-important", 2, prio=-1, idx=1))
    sched.add(seq("early", 2, prio=0, idx=0))
    assert [s.seq.request_id for s in run_step(sched).scheduled] == ["late-important"]
    fcfs, _ = make(budget=64, max_seqs=1, policy=FCFSPolicy())
    fcfs.add(seq("late-important", 2, prio=-1, idx=1))
    fcfs.add(seq("early", 2, prio=0, idx=0))
    assert [s.seq.request_id for s in run_step(fcfs).scheduled] == ["early"]


def test_prefix_cache_skips_computed_blocks_on_admission():
    sched, pool = make(bs=4, budget=64)
    a = seq("a", 9)
    sched.add(a)
    run_step(sched)
    sched.finish(a, "stop")
    b = Sequence("b", list(a.prompt_token_ids[:8]) + [555, 556], SamplingParams(), 0, 1)
    sched.add(b)
    out = run_step(sched)
    assert (out.scheduled[0].start, out.scheduled[0].num_new_tokens) == (8, 2)
    assert b.num_cached_tokens == 8
    assert b.block_table[:2] == a.block_table[:2] if a.block_table else True


def test_finish_frees_blocks():
    sched, pool = make(n_blocks=4, bs=4, budget=64)
    a = seq("a", 6)
    sched.add(a)
    run_step(sched)
    assert pool.num_free == 2
    sched.finish(a, "stop")
    assert pool.num_free == 4 and not sched.has_unfinished()

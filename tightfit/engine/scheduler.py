"""Continuous batching: each step decides which sequences run and how many tokens each
computes, under a token budget (long prompts are prefilled in chunks so decodes never stall)
and the memory pool's tiers. When blocks run out, the least important running sequence is
preempted — by recompute (drop its KV) or swap (park its blocks in the swap area), whichever the
cost rule says is cheaper — and a more important waiting request may preempt running ones.

Pure Python: hands the runner a SchedulerOutput and never touches tensors. The queue order is
a swappable policy: priority then arrival (vLLM's convention: lower value first) with aging, so
that low priority cannot starve, or plain FCFS.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from tightfit.config import SchedulerConfig
from tightfit.engine.block_pool import BlockPool
from tightfit.engine.memory_pool import MemoryPool, PreemptionCostModel, Tier
from tightfit.engine.request import Sequence, Status
from tightfit.errors import RequestError


class FCFSPolicy:
    """Arrival order."""

    def key(self, seq: Sequence) -> tuple:
        return (seq.arrival_index,)

    def rank(self, seq: Sequence) -> int:
        return 0  # no request outranks another


class PriorityPolicy:
    """Lower `priority` value first, then arrival; each `aging_s` seconds spent waiting
    improves a waiting request's priority by one level (0 disables aging). Running requests
    keep their own priority, so aging never shields low-priority work from preemption."""

    def __init__(self, aging_s: float = 0.0) -> None:
        self.aging_s = aging_s

    def key(self, seq: Sequence) -> tuple:
        prio = seq.priority
        if self.aging_s > 0 and seq.status is Status.WAITING:
            prio -= int((time.perf_counter() - seq.waiting_since) / self.aging_s)
        return (prio, seq.arrival_index)

    def rank(self, seq: Sequence) -> int:
        """The priority level alone (with aging): what outranks what across requests."""
        return self.key(seq)[0]


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int
    start: int  # position of the first token computed this step
    # True when this chunk reaches the end of the known tokens, so its logits are needed.
    samples: bool = field(init=False)

    def __post_init__(self) -> None:
        self.samples = self.start + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # ("out", blocks, slots) parks blocks in swap slots; ("in", blocks, slots) brings them back.
    # Executed in this order, which matters: slots and blocks are reused within a step.
    swaps: list[tuple[str, list[int], list[int]]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, pool: BlockPool, policy: object | None = None,
                 memory: MemoryPool | None = None, idle_ttl_s: float | None = None) -> None:
        self.cfg = cfg
        self.pool = pool
        self.memory = memory or MemoryPool(pool, (Tier("all", cfg.max_model_len, 1.0),))
        self.policy = policy or PriorityPolicy(cfg.aging_s)
        self.cost = PreemptionCostModel()
        self.idle_ttl_s = idle_ttl_s
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_swaps = 0
        self._last_reclaim = 0.0

    def add(self, seq: Sequence) -> None:
        """Queues a request, or refuses it up front (too long for any tier, queue full)."""
        if len(self.waiting) >= self.cfg.max_waiting:
            raise RequestError(f"the queue is full ({self.cfg.max_waiting} waiting requests); "
                               "retry later")
        seq.tier = self.memory.tier_for(min(seq.num_prompt_tokens + seq.params.max_tokens,
                                            self.cfg.max_model_len))
        seq.status = Status.WAITING
        seq.waiting_since = time.perf_counter()
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _busy_tiers(self) -> set[int]:
        return {s.tier for s in self.running} | {s.tier for s in self.waiting}

    def schedule(self) -> SchedulerOutput:
        """Running sequences first, in policy order; then admissions. Two rules keep a more
        important request's time to first token short while less important work is prefilling:
        a running prefill is deferred while a request that outranks it waits (the newcomer gets
        the budget first), and a step that carries a prefill for a more important request does
        not also carry a less important one's prefill chunk. Background requests (priority > 0)
        prefill in chunks of `background_chunk_tokens`, so that any step a newcomer must wait
        out is short."""
        self._reclaim_idle()
        out = SchedulerOutput()
        budget = self.cfg.max_num_batched_tokens
        self.running.sort(key=self.policy.key)
        best_waiting = min((self.policy.rank(s) for s in self.waiting), default=None)
        deferred: list[Sequence] = []
        for seq in list(self.running):
            if budget == 0:
                break
            if seq not in self.running:  # preempted while making room for an earlier one
                continue
            remaining = seq.num_tokens - seq.num_computed_tokens
            if remaining > 1 and best_waiting is not None and best_waiting < self.policy.rank(seq):
                deferred.append(seq)
                continue
            n = min(remaining, budget, self._chunk_cap(seq, out))
            if n == 0 or not self._make_room(seq, n, out):
                continue
            out.scheduled.append(ScheduledSeq(seq, n, seq.num_computed_tokens))
            budget -= n
        if not out.preempted:  # admitting while preempting for growth would thrash
            self._admit(out)
        self._schedule_deferred(deferred, out)
        self._yield_decodes(out)
        return out

    def _yield_decodes(self, out: SchedulerOutput) -> None:
        """In a step that gives a request its first token, less important decodes sit out: the
        runner computes decodes and each prefill as separate passes, so this pass is the
        newcomer's whole wait. Each such request costs them one step, once; no starvation."""
        firsts = [self.policy.rank(x.seq) for x in out.scheduled
                  if x.samples and x.seq.num_tokens == x.seq.num_prompt_tokens]
        if not firsts:
            return
        top = min(firsts)
        out.scheduled = [x for x in out.scheduled
                         if not (x.start == x.seq.num_tokens - 1 and x.num_new_tokens == 1
                                 and self.policy.rank(x.seq) > top)]

    def _chunk_cap(self, seq: Sequence, out: SchedulerOutput) -> int:
        """Most tokens seq may compute this step: background requests
        (priority > 0) share `background_chunk_tokens` of prefill per step; decodes always go."""
        if seq.priority <= 0 or seq.num_tokens - seq.num_computed_tokens <= 1:
            return self.cfg.max_num_batched_tokens
        used = sum(x.num_new_tokens for x in out.scheduled
                   if x.seq.priority > 0 and x.start < x.seq.num_tokens - 1)
        return max(0, self.cfg.background_chunk_tokens - used)

    def _top_prefill_rank(self, out: SchedulerOutput) -> int | None:
        """The best rank among the prefills in this step (None: no prefill yet)."""
        return min((self.policy.rank(x.seq) for x in out.scheduled
                    if x.start < x.seq.num_tokens - 1), default=None)

    def _schedule_deferred(self, deferred: list[Sequence], out: SchedulerOutput) -> None:
        """Leftover budget to the prefills deferred for waiting requests that outrank them,
        unless this step already prefills something more important."""
        top = self._top_prefill_rank(out)
        for seq in deferred:
            budget = self.cfg.max_num_batched_tokens - out.num_tokens
            if budget <= 0 or (top is not None and top < self.policy.rank(seq)):
                break
            if seq not in self.running:  # preempted by an admission
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget, self._chunk_cap(seq, out))
            if n > 0 and self._make_room(seq, n, out):
                out.scheduled.append(ScheduledSeq(seq, n, seq.num_computed_tokens))

    def _reclaim_idle(self) -> None:
        now = time.monotonic()
        if self.idle_ttl_s is not None and now - self._last_reclaim > 1.0:
            self._last_reclaim = now
            self.pool.reclaim_idle(self.idle_ttl_s, now)

    def _blocks_to_grow(self, seq: Sequence, n: int) -> int:
        return self.pool.blocks_needed(seq.num_computed_tokens + n) - len(seq.block_table)

    def _make_room(self, seq: Sequence, n: int, out: SchedulerOutput) -> bool:
        """Grows seq's block table for n more tokens, preempting the least important running
        sequences not yet scheduled this step; preempts seq itself if nothing else can give."""
        need = self._blocks_to_grow(seq, n)
        while need > self.memory.available(seq.tier, self._busy_tiers()):
            victims = self._victims(seq, out, strictly_lower=False)
            if not victims:
                self._preempt(seq, out)
                return False
            self._preempt(max(victims, key=self.policy.key), out)
        if need > 0:
            seq.block_table.extend(self.memory.take(seq.tier, need))
        return True

    def _victims(self, seq: Sequence, out: SchedulerOutput, strictly_lower: bool) -> list[Sequence]:
        """Running sequences whose blocks would help seq: same tier, or tiers over quota."""
        # Growth only takes from sequences not yet scheduled (all less important, as running is
        # visited in policy order); a waiting request may also unschedule one from this step.
        scheduled = set() if strictly_lower else {id(x.seq) for x in out.scheduled}
        key = self.policy.key(seq)
        return [s for s in self.running if s is not seq and id(s) not in scheduled
                and (s.tier == seq.tier or self.memory.over_quota(s.tier))
                and (not strictly_lower or (self.policy.key(s) > key
                                            and s.num_preemptions < self.cfg.max_preemptions))]

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        out.scheduled = [x for x in out.scheduled if x.seq is not seq]  # bookkeeping only so far
        mode = self.cfg.preemption_mode
        blocks = len(seq.block_table)
        can_swap = 0 < blocks <= self.memory.swap.num_free
        swap = can_swap and (mode == "swap" or (mode == "auto" and self.cost.prefer_swap(
            seq.num_computed_tokens, blocks)))
        if swap:  # park the KV blocks; progress is kept
            seq.swap_slots = self.memory.swap.take(blocks)
            out.swaps.append(("out", list(seq.block_table), seq.swap_slots))
            self.num_swaps += 1
        else:  # recompute: drop the KV; the sequence re-prefills all its tokens later
            seq.num_computed_tokens = 0
            seq.block_hashes = []
        self.memory.release(seq.tier, seq.block_table)
        seq.block_table = []
        seq.num_preemptions += 1
        seq.status = Status.WAITING
        seq.waiting_since = time.perf_counter()
        self.running.remove(seq)
        self.waiting.append(seq)
        self.num_preemptions += 1
        out.preempted.append(seq)

    def _admit(self, out: SchedulerOutput) -> None:
        """Admits waiting sequences in policy order. One that does not fit blocks the rest of
        its own tier only (order within a tier is kept; other tiers are not held up)."""
        self.waiting.sort(key=self.policy.key)
        blocked: set[int] = set()
        for seq in list(self.waiting):
            budget = self.cfg.max_num_batched_tokens - out.num_tokens
            if budget <= 0:
                break
            if seq.tier in blocked:
                continue
            budget = min(budget, self._chunk_cap(seq, out))
            if budget == 0:  # the step's background prefill share is spent
                continue
            top = self._top_prefill_rank(out)
            if top is not None and top < self.policy.rank(seq) and \
                    seq.num_tokens - seq.num_computed_tokens > 1:
                continue  # keep a more important prefill's step short
            if len(self.running) >= self.cfg.max_num_seqs and not self._evict_for_slot(seq, out):
                break
            ok = (self._admit_swapped(seq, out, budget) if seq.swap_slots
                  else self._admit_fresh(seq, out, budget))
            if not ok:
                blocked.add(seq.tier)
                continue
            self.waiting.remove(seq)
            self.running.append(seq)
            seq.status = Status.RUNNING

    def _evict_for_slot(self, seq: Sequence, out: SchedulerOutput) -> bool:
        """At max_num_seqs, a more important waiting request takes the slot of the least
        important running one."""
        victims = [s for s in self.running if self.policy.key(s) > self.policy.key(seq)
                   and s.num_preemptions < self.cfg.max_preemptions]
        if not victims:
            return False
        self._preempt(max(victims, key=self.policy.key), out)
        return True

    def _fit(self, seq: Sequence, need: int, out: SchedulerOutput) -> bool:
        """Makes `need` blocks available to a waiting seq, preempting strictly less important
        running sequences, but only if that is enough."""
        avail = self.memory.available(seq.tier, self._busy_tiers())
        if need <= avail:
            return True
        victims = sorted(self._victims(seq, out, strictly_lower=True), key=self.policy.key,
                         reverse=True)
        if need > avail + sum(len(v.block_table) for v in victims):
            return False
        for v in victims:
            self._preempt(v, out)
            if need <= self.memory.available(seq.tier, self._busy_tiers()):
                return True
        return need <= self.memory.available(seq.tier, self._busy_tiers())

    def _admit_fresh(self, seq: Sequence, out: SchedulerOutput, budget: int) -> bool:
        cached, hashes = self.pool.match_prefix(seq.token_ids)
        computed = len(cached) * self.pool.block_size
        n = min(seq.num_tokens - computed, budget)
        need = self.pool.blocks_needed(computed + n) - len(cached)
        self.memory.adopt(seq.tier, len(cached))
        if not self._fit(seq, need, out):
            self.memory.release(seq.tier, cached)
            return False
        seq.block_table = cached + self.memory.take(seq.tier, need)
        seq.block_hashes = hashes
        seq.num_computed_tokens = computed
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = computed
        out.scheduled.append(ScheduledSeq(seq, n, computed))
        return True

    def _admit_swapped(self, seq: Sequence, out: SchedulerOutput, budget: int) -> bool:
        n = min(seq.num_tokens - seq.num_computed_tokens, budget)
        held = len(seq.swap_slots)
        need = self.pool.blocks_needed(seq.num_computed_tokens + n)
        if not self._fit(seq, need, out):
            return False
        seq.block_table = self.memory.take(seq.tier, need)
        out.swaps.append(("in", seq.block_table[:held], seq.swap_slots))
        self.memory.swap.give_back(seq.swap_slots)
        seq.swap_slots = []
        out.scheduled.append(ScheduledSeq(seq, n, seq.num_computed_tokens))
        return True

    def after_step(self, out: SchedulerOutput) -> None:
        """Advances progress and registers newly completed full blocks in the prefix cache."""
        bs = self.pool.block_size
        for s in out.scheduled:
            seq = s.seq
            seq.num_computed_tokens = s.start + s.num_new_tokens
            for i in range(len(seq.block_hashes), seq.num_computed_tokens // bs):
                parent = seq.block_hashes[-1] if seq.block_hashes else None
                tokens = seq.token_ids[i * bs:(i + 1) * bs]
                seq.block_hashes.append(self.pool.cache_block(seq.block_table[i], parent, tokens))

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        self.memory.release(seq.tier, seq.block_table)
        seq.block_table = []
        if seq.swap_slots:
            self.memory.swap.give_back(seq.swap_slots)
            seq.swap_slots = []

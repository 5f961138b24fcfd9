"""Continuous batching: each step decides which sequences run and how many tokens each
computes, under a token budget (long prompts are prefilled in chunks so decodes never stall)
and the block pool's capacity (recompute-preemption of the least important running sequence).

Pure Python: hands the runner a SchedulerOutput and never touches tensors. The waiting-queue
order is a swappable policy (FCFS, or priority then arrival as in vLLM: lower value first).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tightfit.config import SchedulerConfig
from tightfit.engine.block_pool import BlockPool
from tightfit.engine.request import Sequence, Status


class FCFSPolicy:
    """Arrival order."""

    def key(self, seq: Sequence) -> tuple:
        return (seq.arrival_index,)


class PriorityPolicy:
    """Lower `priority` value first, then arrival (vLLM's convention)."""

    def key(self, seq: Sequence) -> tuple:
        return (seq.priority, seq.arrival_index)


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

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, pool: BlockPool, policy: object | None = None) -> None:
        self.cfg = cfg
        self.pool = pool
        self.policy = policy or PriorityPolicy()
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.cfg.max_num_batched_tokens
        self.running.sort(key=self.policy.key)
        for seq in list(self.running):
            if budget == 0:
                break
            if seq not in self.running:  # preempted while making room for an earlier one
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._make_room(seq, n, out):
                continue
            out.scheduled.append(ScheduledSeq(seq, n, seq.num_computed_tokens))
            budget -= n
        if not out.preempted:  # admitting while preempting would thrash
            budget = self._admit(out, budget)
        return out

    def _make_room(self, seq: Sequence, n: int, out: SchedulerOutput) -> bool:
        """Grows seq's block table for n more tokens, preempting the least important other
        running sequences if needed; preempts seq itself if nothing else can give way."""
        need = self.pool.blocks_needed(seq.num_computed_tokens + n) - len(seq.block_table)
        while need > self.pool.num_free:
            victims = [s for s in self.running if s is not seq
                       and all(s is not x.seq for x in out.scheduled)]
            if not victims:
                self._preempt(seq, out)
                return False
            self._preempt(max(victims, key=self.policy.key), out)
        if need > 0:
            seq.block_table.extend(self.pool.allocate(need))
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Recompute-preemption: drop the KV blocks; the sequence re-prefills all its tokens."""
        self.pool.free(seq.block_table)
        seq.block_table, seq.block_hashes = [], []
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = Status.WAITING
        self.running.remove(seq)
        self.waiting.append(seq)
        self.num_preemptions += 1
        out.preempted.append(seq)

    def _admit(self, out: SchedulerOutput, budget: int) -> int:
        self.waiting.sort(key=self.policy.key)
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            cached, hashes = self.pool.match_prefix(seq.token_ids)
            computed = len(cached) * self.pool.block_size
            n = min(seq.num_tokens - computed, budget)
            need = self.pool.blocks_needed(computed + n) - len(cached)
            if need > self.pool.num_free:
                self.pool.free(cached)
                break
            seq.block_table = cached + self.pool.allocate(need)
            seq.block_hashes = hashes
            seq.num_computed_tokens = computed
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = computed
            seq.status = Status.RUNNING
            self.waiting.pop(0)
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n, computed))
            budget -= n
        return budget

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
        self.pool.free(seq.block_table)
        seq.block_table = []

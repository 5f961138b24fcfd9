"""Decode steps through `torch.compile` (Inductor with its C++ wrapper): one compiled graph for
the layers, final norm and output head, so a decode step costs the kernels and not ~80 Python
dispatches per layer. Opt-in (`LLM(compile_decode=True)`, `--compile`).

Why: single-stream decode of the default model spends ~55% of each step outside the matmuls
(norms, rotary, views, casts; docs/performance.md); the compiled 30 layers run in ~8 ms against
~18 ms eager. Cost: compiling the two variants (one sequence; several) took ~4 minutes on 2
cores the first time, and 70-140 s once Inductor's on-disk cache holds them.

Only decode-only steps with one length bucket, fast attention and an fp32 KV cache take this
path; prefill, mixed steps, int8 KV and studies run eagerly, so results never depend on it
beyond float rounding (same kernels; fused elementwise code may round differently).
Shapes are dynamic (context length, batch, pool size); size-1 batches are a separate variant.
"""
from __future__ import annotations

from typing import Any

import torch

from tightfit.engine.attention import AttentionGroup, AttentionMetadata

_ATTR = "_tightfit_compiled_decode"


class CompiledDecode:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.sliding = bool(model.cfg.has_sliding_layers)
        self.fn = torch.compile(self._run, dynamic=True, options={"cpp_wrapper": True})
        self.warmed = False

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> CompiledDecode:
        """One per model, shared by every engine built on its weights (`LLM.derive`)."""
        found = getattr(model, _ATTR, None)
        if found is None:
            found = cls(model)
            object.__setattr__(model, _ATTR, found)  # not a submodule: no state_dict entry
        return found

    def _run(self, x: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
             kv_blocks: torch.Tensor, mask: torch.Tensor, sliding_mask: torch.Tensor | None,
             rows: torch.Tensor, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
             ) -> torch.Tensor:
        group = AttentionGroup(0, x.shape[0], 1, None, mask, sliding_mask, kv_blocks=kv_blocks,
                               kv_len=mask.shape[-1])
        meta = AttentionMetadata(slot_mapping=slot_mapping, groups=[group])
        return self.model.forward_hidden(x, positions, meta, kv_caches, rows, "fast")

    @staticmethod
    def eligible(meta: AttentionMetadata, kv_caches: list[tuple[Any, Any]]) -> bool:
        """A decode-only step in one length bucket (prepare() gives every prefill chunk its own
        group), reading the paged cache, with an fp32 KV cache."""
        return (len(meta.groups) == 1 and meta.groups[0].q_len == 1
                and meta.groups[0].kv_blocks is not None and meta.attend is None
                and isinstance(kv_caches[0][0], torch.Tensor))

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]], rows: torch.Tensor
                 ) -> torch.Tensor:
        g = meta.groups[0]
        assert g.kv_blocks is not None
        # Always a mask (all True when nothing is padded; its length is the context read) and,
        # for sliding-window models, always a sliding mask: fewer graph variants than
        # None-or-tensor would give.
        mask = g.mask if g.mask is not None else torch.ones(g.batch, 1, 1, g.kv_len,
                                                            dtype=torch.bool)
        sliding = (g.sliding_mask if g.sliding_mask is not None else mask) if self.sliding \
            else None
        x = self.model.embed_tokens(input_ids)
        return self.fn(x, positions, meta.slot_mapping, g.kv_blocks, mask, sliding, rows,
                       kv_caches)

    def warmup(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], block_size: int) -> None:
        """Compiles both variants (one sequence; two) now, not on the first request; once per
        model (shapes are dynamic, so later engines' pools need no new variant). Writes K/V into
        slots of block 0, which holds no sequence yet."""
        if self.warmed:
            return
        slots = min(block_size, kv_caches[0][0].shape[0] * kv_caches[0][0].shape[1])
        with torch.inference_mode():  # as in ModelRunner.execute: guards see inference tensors
            for batch in (1, 2):
                ctx = max(2, slots // 2)
                blocks = torch.zeros(batch, 1, dtype=torch.long)
                meta = AttentionMetadata(slot_mapping=torch.arange(batch) + ctx - batch,
                                         groups=[AttentionGroup(0, batch, 1, None, None,
                                                                kv_blocks=blocks, kv_len=ctx)])
                self(torch.zeros(batch, dtype=torch.long), torch.full((batch,), ctx - 1), meta,
                     kv_caches, torch.arange(batch))
        self.warmed = True

"""Token embedding kept in its stored GGUF block format (e.g. Q8_0): rows are gathered as raw
blocks and dequantised per lookup, so the table costs ~1 byte per weight instead of 4 and the
looked-up values are bit-exact with the file. Lookups touch only the requested rows."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn


class QuantizedEmbedding(nn.Module):
    def __init__(self, native: Any) -> None:
        """native: a loader NativeTensor holding the [vocab, hidden] table's raw blocks."""
        super().__init__()
        t = native.tensor
        self.qtype = t.qtype
        self.num_embeddings, self.embedding_dim = int(t.shape[0]), int(t.shape[1])
        rows = torch.from_numpy(t.data.reshape(self.num_embeddings, -1).copy())
        t.release()
        self.register_buffer("rows", rows, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        from tightfit.engine.loader.dequant import dequantize

        picked = self.rows[ids.reshape(-1)].numpy()
        out = dequantize(picked, self.qtype, (picked.shape[0], self.embedding_dim))
        return out.view(*ids.shape, self.embedding_dim)

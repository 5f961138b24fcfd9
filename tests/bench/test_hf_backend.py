"""The HF Transformers backend on the shared HF reference model (slow: loads HF when the session
has not already): static left-padded batches, per-row lengths, timings from the step clock."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def backend(hf_default):
    from tightfit.bench.backends.base import BackendOptions
    from tightfit.bench.backends.hf_backend import HFBackend

    b = HFBackend(BackendOptions(threads=2, max_num_seqs=2), model=hf_default)
    b.load()
    return b


def test_static_batches_with_per_row_lengths(backend):
    from tightfit.bench.workloads import Arrival, BenchRequest

    reqs = [BenchRequest(i, tuple(range(300, 300 + n)), out, None, 0)
            for i, (n, out) in enumerate([(6, 3), (12, 5), (9, 2)])]
    ts = backend.run(reqs, Arrival("closed", concurrency=3))
    assert [t.output_tokens for t in ts] == [3, 5, 2]
    # batch cap 2: the first two go together and share their first-token step
    assert ts[0].first_token_s == ts[1].first_token_s
    assert ts[0].finished_s < ts[1].finished_s
    assert ts[2].first_token_s > ts[1].finished_s
    assert backend.run_config()["max_batch_size"] == 2


def test_hf_refuses_other_weight_formats():
    from tightfit.bench.backends.base import BackendOptions
    from tightfit.bench.backends.hf_backend import HFBackend
    from tightfit.errors import TightfitError

    with pytest.raises(TightfitError, match="fp32 only"):
        HFBackend(BackendOptions(quant="int8")).load()

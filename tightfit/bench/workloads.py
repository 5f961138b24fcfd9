"""Scenario workloads: named templates (length distributions, arrival process, priority mix, SLO)
turned into concrete, seeded request lists whose prompts are real text cut to exact token counts.

Prose comes from `pydoc_data.topics` (Python's documentation, shipped with the interpreter); code
from the standard library's own source files. Same scenario + seed + tokenizer -> the same token
ids, on any machine. Does not run anything: backends replay the `Workload`.
"""
from __future__ import annotations

import functools
import importlib.util
import math
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

from tightfit.errors import TightfitError

ArrivalKind = Literal["closed", "poisson", "bursty"]
Source = Literal["prose", "code"]
CODE_MODULES = ("textwrap", "json.decoder", "json.encoder", "argparse", "dataclasses",
                "functools", "heapq", "bisect", "statistics", "shlex", "fractions", "string")


class TokenSource(Protocol):
    """What a workload needs from a tokenizer (tightfit's `Tokenizer` fits)."""

    add_bos_token: bool
    bos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class Lengths:
    """Token counts: uniform on [lo, hi], or log-normal around `median` (sigma in log space)
    clipped to [lo, hi]; lo == hi is a fixed length."""

    lo: int
    hi: int
    median: float | None = None
    sigma: float = 0.6

    def __post_init__(self) -> None:
        if not 1 <= self.lo <= self.hi:
            raise TightfitError(f"token lengths need 1 <= lo <= hi, got lo={self.lo}, hi={self.hi}")

    def sample(self, rng: random.Random) -> int:
        if self.lo == self.hi:
            return self.lo
        if self.median is None:
            return rng.randint(self.lo, self.hi)
        value = round(math.exp(rng.gauss(math.log(self.median), self.sigma)))
        return min(self.hi, max(self.lo, value))

    @classmethod
    def fixed(cls, n: int) -> Lengths:
        return cls(n, n)


@dataclass(frozen=True)
class Arrival:
    """closed: `concurrency` requests in flight, the next sent when one finishes; poisson:
    exponential gaps at `rate_rps`; bursty: `burst_size` requests at once, bursts at `rate_rps /
    burst_size` per second (exponential gaps), so the mean rate is still `rate_rps`."""

    kind: ArrivalKind = "closed"
    concurrency: int = 1
    rate_rps: float | None = None
    burst_size: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("closed", "poisson", "bursty"):
            raise TightfitError(f"arrival must be closed, poisson or bursty, got {self.kind!r}")
        if self.kind == "closed" and self.concurrency < 1:
            raise TightfitError(f"closed-loop concurrency must be >= 1, got {self.concurrency}")
        if self.kind != "closed" and not (self.rate_rps and self.rate_rps > 0):
            raise TightfitError(f"{self.kind} arrivals need rate_rps > 0, got {self.rate_rps}")
        if self.kind == "bursty" and not (self.burst_size and self.burst_size >= 1):
            raise TightfitError(f"bursty arrivals need burst_size >= 1, got {self.burst_size}")

    def times(self, rng: random.Random, n: int) -> list[float | None]:
        """Arrival offsets in seconds (None: closed loop, sent when a slot frees)."""
        if self.kind == "closed":
            return [None] * n
        assert self.rate_rps is not None
        if self.kind == "poisson":
            return _cumulative(rng.expovariate(self.rate_rps) for _ in range(n))
        assert self.burst_size is not None
        starts = _cumulative(rng.expovariate(self.rate_rps / self.burst_size)
                             for _ in range(math.ceil(n / self.burst_size)))
        return [starts[i // self.burst_size] for i in range(n)]


def _cumulative(gaps: Any) -> list[float | None]:
    out, t = [], 0.0
    for gap in gaps:
        out.append(t)
        t += gap
    return out


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    prompt: Lengths
    output: Lengths
    arrival: Arrival
    num_requests: int
    priorities: tuple[tuple[int, float], ...] = ((0, 1.0),)  # (priority, share); lower = sooner
    slo_ttft_ms: float | None = None
    source: Source = "prose"


@dataclass(frozen=True)
class BenchRequest:
    index: int
    prompt_ids: tuple[int, ...]
    max_tokens: int
    arrival_s: float | None  # None: closed loop
    priority: int


@dataclass(frozen=True)
class Workload:
    scenario: Scenario
    seed: int
    requests: tuple[BenchRequest, ...]

    def describe(self) -> dict[str, Any]:
        """Fields of the dataset's `WorkloadDescriptor`."""
        s, reqs = self.scenario, self.requests
        prompts = [len(r.prompt_ids) for r in reqs]
        gens = [r.max_tokens for r in reqs]
        return dict(
            scenario=s.name, seed=self.seed, num_requests=len(reqs), arrival=s.arrival.kind,
            concurrency=s.arrival.concurrency if s.arrival.kind == "closed" else None,
            rate_rps=s.arrival.rate_rps, burst_size=s.arrival.burst_size,
            prompt_tokens_mean=sum(prompts) / len(reqs), prompt_tokens_max=max(prompts),
            gen_tokens_mean=sum(gens) / len(reqs), gen_tokens_max=max(gens),
            context_tokens_max=max(p + g for p, g in zip(prompts, gens)),
            priority_mix={str(p): w for p, w in s.priorities}, slo_ttft_ms=s.slo_ttft_ms)

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario.name, "seed": self.seed,
                "requests": [asdict(r) for r in self.requests]}


def _s(name: str, description: str, prompt: Lengths, output: Lengths, arrival: Arrival,
       num_requests: int, **kw: Any) -> Scenario:
    return Scenario(name, description, prompt, output, arrival, num_requests, **kw)


# Sizes suit small models on small machines; sweeps scale them through `Overrides`.
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    _s("chat", "interactive chat turns, Poisson arrivals, a fifth of users on a premium tier",
       Lengths(16, 512, median=96), Lengths(8, 192, median=64), Arrival("poisson", rate_rps=0.5),
       16, priorities=((0, 0.2), (1, 0.8)), slo_ttft_ms=1000),
    _s("long-doc-qa", "question answering over a long document, two users at a time",
       Lengths(768, 1536), Lengths(16, 64), Arrival("closed", concurrency=2), 4, slo_ttft_ms=5000),
    _s("code-completion", "editor completions on source code, short answers, tight latency",
       Lengths(128, 512), Lengths(8, 48), Arrival("poisson", rate_rps=1.0), 16,
       slo_ttft_ms=500, source="code"),
    _s("summarisation", "summaries of long passages, four at a time",
       Lengths(512, 1024), Lengths(64, 128), Arrival("closed", concurrency=4), 8),
    _s("batch-classification", "offline labelling: many short prompts, a label each, low priority",
       Lengths(32, 128), Lengths.fixed(2), Arrival("closed", concurrency=16), 32,
       priorities=((2, 1.0),)),
    _s("agent-tool-calls", "agent steps: tool schemas in the prompt, bursts of parallel calls",
       Lengths(256, 768), Lengths(16, 64), Arrival("bursty", rate_rps=0.5, burst_size=4), 16,
       slo_ttft_ms=1000),
    _s("finance-risk", "risk scoring: short prompts, short answers, strict latency, mostly urgent",
       Lengths(24, 64), Lengths(2, 8), Arrival("poisson", rate_rps=4.0), 24,
       priorities=((0, 0.9), (1, 0.1)), slo_ttft_ms=200),
    _s("industrial-inspection", "inspection verdicts: tiny prompts, one verdict, sub-50 ms target",
       Lengths(4, 16), Lengths.fixed(2), Arrival("poisson", rate_rps=8.0), 32, slo_ttft_ms=50),
    # The primitives `tightfit bench` compares engines on.
    _s("decode", "one stream: short prompt, long generation", Lengths.fixed(18),
       Lengths.fixed(64), Arrival("closed"), 1),
    _s("ttft", "one request at a time, 18-token prompt", Lengths.fixed(18), Lengths.fixed(2),
       Arrival("closed"), 3),
    _s("prefill", "one request at a time, 510-token prompt", Lengths.fixed(510), Lengths.fixed(2),
       Arrival("closed"), 2),
    _s("concurrent-16", "16 requests at once, 64 tokens each", Lengths(16, 48), Lengths.fixed(64),
       Arrival("closed", concurrency=16), 16),
)}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise TightfitError(
            f"unknown scenario {name!r}; known: {', '.join(sorted(SCENARIOS))}") from None


@dataclass(frozen=True)
class Overrides:
    """Sweep axes that reshape a scenario. None leaves the template's value."""

    num_requests: int | None = None
    prompt_tokens: int | None = None  # fixed prompt length
    output_tokens: int | None = None  # fixed output length
    concurrency: int | None = None  # closed loop with this many in flight
    rate_rps: float | None = None  # open loop at this mean rate (keeps poisson/bursty)

    def apply(self, s: Scenario) -> Scenario:
        if self.num_requests is not None:
            if self.num_requests < 1:
                raise TightfitError(f"num_requests must be >= 1, got {self.num_requests}")
            s = replace(s, num_requests=self.num_requests)
        if self.prompt_tokens is not None:
            s = replace(s, prompt=Lengths.fixed(self.prompt_tokens))
        if self.output_tokens is not None:
            s = replace(s, output=Lengths.fixed(self.output_tokens))
        if self.concurrency is not None:
            s = replace(s, arrival=Arrival("closed", concurrency=self.concurrency))
        if self.rate_rps is not None:
            kind = s.arrival.kind if s.arrival.kind != "closed" else "poisson"
            s = replace(s, arrival=replace(s.arrival, kind=kind, rate_rps=self.rate_rps))
        return s


def build_workload(scenario: Scenario | str, tokenizer: TokenSource, seed: int = 0,
                   overrides: Overrides | None = None) -> Workload:
    """Concrete requests: exact prompt lengths (BOS included when the model wants one).

    Lengths, text offsets, arrivals and priorities each draw from their own seeded stream, so
    changing one (say, the tokenizer) leaves the others as they were."""
    s = get_scenario(scenario) if isinstance(scenario, str) else scenario
    s = overrides.apply(s) if overrides else s
    lengths, offsets, arrivals_rng, prios = (rng_for(s.name, seed, part) for part in
                                             ("lengths", "offsets", "arrivals", "priorities"))
    ids = corpus_ids(tokenizer, s.source)
    prefix = [tokenizer.bos_token_id] if tokenizer.add_bos_token and \
        tokenizer.bos_token_id is not None else []
    arrivals = s.arrival.times(arrivals_rng, s.num_requests)
    reqs = []
    for i in range(s.num_requests):
        n_prompt, n_out = s.prompt.sample(lengths), s.output.sample(lengths)
        prompt = prefix + cut(ids, n_prompt - len(prefix), offsets)
        reqs.append(BenchRequest(i, tuple(prompt), n_out, arrivals[i], _priority(s, prios)))
    return Workload(s, seed, tuple(reqs))


def rng_for(name: str, seed: int, part: str) -> random.Random:
    """A seeded stream per (scenario, seed, purpose); str seeds hash stably across runs."""
    return random.Random(f"{name}:{seed}:{part}")


def cut(ids: list[int], n: int, rng: random.Random) -> list[int]:
    """`n` consecutive corpus tokens from a seeded offset (n <= 0 gives [])."""
    if n <= 0:
        return []
    if n > len(ids):
        raise TightfitError(f"a {n}-token prompt is longer than the {len(ids)}-token text corpus")
    start = rng.randrange(0, len(ids) - n + 1)
    return ids[start:start + n]


def _priority(s: Scenario, rng: random.Random) -> int:
    prios, weights = zip(*s.priorities)
    return rng.choices(prios, weights)[0]


def corpus_text(source: Source) -> str:
    if source == "prose":
        from pydoc_data.topics import topics

        return "\n\n".join(topics[k] for k in sorted(topics))
    parts = []
    for mod in CODE_MODULES:
        spec = importlib.util.find_spec(mod)
        assert spec is not None and spec.origin, mod  # standard library: always present
        parts.append(Path(spec.origin).read_text(encoding="utf-8"))
    return "\n\n".join(parts)


def corpus_ids(tokenizer: TokenSource, source: Source) -> list[int]:
    return list(_corpus_ids_cached(tokenizer, source))


@functools.lru_cache(maxsize=8)
def _corpus_ids_cached(tokenizer: TokenSource, source: Source) -> tuple[int, ...]:
    return tuple(tokenizer.encode(corpus_text(source), add_special_tokens=False))

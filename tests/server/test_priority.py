"""The `priority` extension (lower value served first, as in vLLM), seen through the HTTP API
and through the running/waiting-by-priority metrics."""
from __future__ import annotations

import re
import threading
import time
from typing import Any

import httpx


def test_lower_priority_value_is_served_first(make_server: Any) -> None:
    live = make_server(max_num_seqs=1)  # one sequence at a time: the waiting order shows
    finished: list[str] = []
    first_chunk, release = threading.Event(), threading.Event()

    def blocker() -> None:  # holds the only slot until released, then disconnects
        body = {"prompt": "Tell me a story.", "max_tokens": 300, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", live.url + "/v1/completions", json=body, timeout=300) as r:
            for _ in r.iter_lines():
                first_chunk.set()
                if release.is_set():
                    break

    def request(name: str, priority: int, max_tokens: int) -> None:
        body = {"prompt": f"Request {name}.", "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "priority": priority}
        r = httpx.post(live.url + "/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        finished.append(name)

    threads = [threading.Thread(target=blocker)]
    threads[0].start()
    assert first_chunk.wait(120)
    for args in (("low", 10, 2), ("high", -10, 20)):  # the low-priority one arrives first
        threads.append(threading.Thread(target=request, args=args))
        threads[-1].start()
        time.sleep(0.2)
    metrics = _wait_for_queues(live, {"0": 1, "10": 1, "-10": 1})
    release.set()
    for t in threads:
        t.join(300)
    # Whether or not the scheduler preempts the blocker for "high", "low" comes last.
    assert finished == ["high", "low"]
    assert 'tightfit:num_requests_waiting{priority="10"} 1.0' in metrics


def _by_priority(metrics: str) -> dict[str, int]:
    """Running + waiting sequences per priority label, from the Prometheus text."""
    counts: dict[str, int] = {}
    for line in metrics.splitlines():
        m = re.match(r'tightfit:num_requests_(running|waiting)\{priority="(-?\d+)"\} (\S+)', line)
        if m and float(m.group(3)):
            counts[m.group(2)] = counts.get(m.group(2), 0) + int(float(m.group(3)))
    return counts


def _wait_for_queues(live: Any, want: dict[str, int], timeout: float = 60) -> str:
    """Polls /metrics until running + waiting by priority equals `want`; returns that text."""
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(live.url + "/metrics").text
        if _by_priority(text) == want:
            return text
        assert time.monotonic() < deadline, f"queues never reached {want}: {_by_priority(text)}"
        time.sleep(0.05)

"""What the agent costs, measured: the middleware's added time per request and the census's time and pause.

    python crates/cli/python/bench/census_bench.py [--quick]

Prints one JSON document (the figures docs/agent.md and docs/benchmarks.md quote):

- ``middleware``: a bare ASGI app called directly, N requests without and with ``LeaklabDebug``
  in front, interleaved in rounds so that both see the same machine; the median of the rounds'
  per-request times, the added microseconds and the ratio.
- ``census``: a process with 10,000 live tensors (held as request records in a list) and
  enough extra Python objects (instances with a list, dicts) to reach about 10k, 100k and 1M
  more tracked objects than the interpreter and torch already have; for each, the census's
  wall time (best of a few), its phases, the longest gap an asyncio event loop saw while the
  census ran in a worker thread (how long the census kept it waiting for the GIL), the same
  loop's longest gap with no census (what the machine's own scheduling costs), one
  ``gc.get_objects()`` call (the longest stretch the census holds the GIL without a break), and
  how far a census raised the process's peak RSS.

The figures depend on the machine: run it on the one you care about, idle.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the package beside this folder, when not installed

from leaklab.asgi import LeaklabDebug  # noqa: E402
from leaklab.census import census  # noqa: E402


async def _bare_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _send(message: dict[str, Any]) -> None:
    return None


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/infer",
        "raw_path": b"/v1/infer",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")],
        "client": ("10.0.0.7", 51234),
        "server": ("127.0.0.1", 8000),
    }


async def _per_request(app: Any, n: int) -> float:
    scope = _scope()
    start = time.perf_counter()
    for _ in range(n):
        await app(scope, _receive, _send)
    return (time.perf_counter() - start) / n


def middleware(requests: int, rounds: int) -> dict[str, Any]:
    wrapped = LeaklabDebug(_bare_app)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_per_request(wrapped, 1000))  # warm both paths
        loop.run_until_complete(_per_request(_bare_app, 1000))
        bare, with_agent = [], []
        for _ in range(rounds):
            bare.append(loop.run_until_complete(_per_request(_bare_app, requests)))
            with_agent.append(loop.run_until_complete(_per_request(wrapped, requests)))
    finally:
        loop.close()
    b, w = statistics.median(bare), statistics.median(with_agent)
    return {
        "requests_per_round": requests,
        "rounds": rounds,
        "bare_us": round(b * 1e6, 3),
        "with_agent_us": round(w * 1e6, 3),
        "added_us": round((w - b) * 1e6, 3),
        "ratio": round(w / b, 3),
        "added_us_rounds": [round((x - y) * 1e6, 3) for x, y in zip(with_agent, bare, strict=True)],
    }


class _Item:
    def __init__(self, i: int) -> None:
        self.i = i
        self.tags = [i]


RECORDS: list[dict[str, Any]] = []  # the tensors, as a service keeps request records
FILLER: list[Any] = []  # the other objects


def _fill(extra: int) -> None:
    FILLER.clear()
    gc.collect()
    # Four tracked objects a round: an instance and its list, a dict and its list (a dict of
    # atomic values only would not be tracked).
    for i in range(extra // 4):
        FILLER.append(_Item(i))
        FILLER.append({"id": i, "seen": [i]})


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _peak_rss_growth() -> float | None:
    """How far one census raises the process's peak RSS above its RSS before it (MB)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the peak, to the current RSS (Linux)
        before = _status("VmRSS:")
        census(max_seconds=60)
        return round((_status("VmHWM:") - before) / 1e6, 1)
    except OSError:
        return None


async def _ticker(stop: threading.Event, gaps: list[float]) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


def _loop_alone(seconds: float) -> tuple[float, float]:
    """The same event loop with no census running: its longest tick (the machine's own noise) and
    its ticks per second."""
    stop = threading.Event()
    gaps: list[float] = []

    async def main() -> None:
        ticker = asyncio.ensure_future(_ticker(stop, gaps))
        await asyncio.sleep(seconds)
        stop.set()
        await ticker

    asyncio.run(main())
    return max(gaps), len(gaps) / sum(gaps)


def _get_objects_ms() -> float:
    """One gc.get_objects() call: the longest the census holds the GIL without a break."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        objs = gc.get_objects()
        best = min(best, time.perf_counter() - start)
        del objs
    return round(best * 1e3, 1)


def _census_with_loop() -> tuple[dict[str, Any], float, float]:
    """A census in a worker thread while an event loop ticks every millisecond: the longest tick,
    and the ticks per second the loop still made."""
    stop = threading.Event()
    gaps: list[float] = []
    result: dict[str, Any] = {}

    def work() -> None:
        result.update(census(max_seconds=60))
        stop.set()

    async def main() -> None:
        ticker = asyncio.ensure_future(_ticker(stop, gaps))
        await asyncio.sleep(0.05)
        gaps.clear()
        thread = threading.Thread(target=work, name="census")
        thread.start()
        await ticker
        thread.join()

    asyncio.run(main())
    return result, max(gaps), len(gaps) / sum(gaps)


def census_costs(sizes: list[int], tensors: int, repeats: int) -> list[dict[str, Any]]:
    import torch

    torch.set_num_threads(1)
    RECORDS.clear()
    RECORDS.extend({"request": f"r{i}", "output": torch.zeros(16)} for i in range(tensors))
    rows = []
    for extra in sizes:
        _fill(extra)
        gc.collect()
        runs = [census(max_seconds=60) for _ in range(repeats)]
        best = min(runs, key=lambda d: d["seconds"])
        peak = _peak_rss_growth()
        done, pause, rate = _census_with_loop()
        alone, alone_rate = _loop_alone(done["seconds"])
        rows.append(
            {
                "extra_objects": extra,
                "objects": best["objects"],
                "visited": best["visited"],
                "tensors": best["totals"]["tensors"],
                "seconds_best": best["seconds"],
                "seconds_all": [d["seconds"] for d in runs],
                "cpu_seconds_best": min(d["cpu_seconds"] for d in runs),
                "phases": best["phases"],
                "event_loop_longest_wait_ms": round(pause * 1e3, 1),
                "event_loop_longest_wait_without_census_ms": round(alone * 1e3, 1),
                "event_loop_ticks_per_s": round(rate),
                "event_loop_ticks_per_s_without_census": round(alone_rate),
                "gc_get_objects_ms": _get_objects_ms(),
                "peak_rss_growth_mb": peak,
                "holder": best["holders"][0]["holder"],
            }
        )
    FILLER.clear()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer requests and sizes (a smoke run)")
    args = parser.parse_args()
    requests, rounds = (2_000, 3) if args.quick else (50_000, 7)
    sizes = [10_000] if args.quick else [10_000, 100_000, 1_000_000]
    report = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_1m": os.getloadavg()[0]},
        "middleware": middleware(requests, rounds),
        "census": census_costs(sizes, tensors=10_000, repeats=1 if args.quick else 3),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

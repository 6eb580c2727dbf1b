"""The request path's added cost of the request counts: LeaklabDebug against the same
middleware without them (its ``__call__`` as it was before the counts) and the bare app; and of a
workers folder (``workers_dir``), whose threads write the worker's figures and serve its own agent
on a loopback port beside the requests.

    python crates/cli/python/bench/request_path.py [--rounds 9] [--requests 50000]

Per-request times are the median over rounds, interleaved so that all three see the same
machine, measured in this thread's CPU time (``time.thread_time``): on a loaded machine the
wall clock mostly measures the waits for a core. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

from census_bench import _bare_app, _receive, _scope, _send  # noqa: E402
from leaklab.asgi import LeaklabDebug  # noqa: E402


class Uncounted(LeaklabDebug):
    """The request path before the counts: one type check and one prefix comparison."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self._prefix):
            await self.app(scope, receive, send)
            return
        rest = scope["path"][len(self._prefix) :]
        if rest and rest[0] != "/":
            await self.app(scope, receive, send)
            return
        await self._serve(scope, rest.strip("/"), send)


async def per_request(app: Any, n: int) -> float:
    scope = _scope()
    start = time.thread_time()
    for _ in range(n):
        await app(scope, _receive, _send)
    return (time.thread_time() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--requests", type=int, default=50_000)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="leaklab-workers-")
    workers = LeaklabDebug(_bare_app, workers_dir=folder, workers_period=0.1)
    apps = {"bare": _bare_app, "uncounted": Uncounted(_bare_app), "counted": LeaklabDebug(_bare_app)}
    apps["workers"] = workers
    times: dict[str, list[float]] = {name: [] for name in apps}
    loop = asyncio.new_event_loop()
    try:
        for app in apps.values():
            loop.run_until_complete(per_request(app, 2000))  # warm every path
        for _ in range(args.rounds):
            for name, app in apps.items():
                times[name].append(loop.run_until_complete(per_request(app, args.requests)))
    finally:
        loop.close()
    us = {name: statistics.median(t) * 1e6 for name, t in times.items()}
    counted = apps["counted"]
    assert isinstance(counted, LeaklabDebug)
    print(
        json.dumps(
            {
                "median_us": {name: round(v, 3) for name, v in us.items()},
                "added_uncounted_us": round(us["uncounted"] - us["bare"], 3),
                "added_counted_us": round(us["counted"] - us["bare"], 3),
                "counts_cost_us": round(us["counted"] - us["uncounted"], 3),
                "workers_cost_us": round(us["workers"] - us["counted"], 3),
                "workers_agent": workers.url,
                "requests_counted": [counted.started, counted.answered],
            }
        )
    )


if __name__ == "__main__":
    main()

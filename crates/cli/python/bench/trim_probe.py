"""The trim probe on two causes of the lab's zoo, each served by uvicorn in a process of its own.

    python crates/cli/python/bench/trim_probe.py [--requests 400] [CAUSE ...]

For each cause (``gc_disabled_cycles``: cycles holding tensors in a service that disabled the
collector; ``malloc_retention``: scratch of random sizes freed on a thread pool), its leaky
variant is served on loopback with ``LeaklabDebug(allow_trim=True)``, sent ``--requests``
requests (the zoo's own bodies), then ``POST /debug/leaklab/trim``. Prints per cause the
anonymous memory the requests added, what ``gc.collect()`` gave back, what ``malloc_trim(0)``
then returned, and the probe's findings, as one JSON document (docs/agent.md quotes it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
ZOO = os.path.join(ROOT, "lab", "zoo")
P = "/debug/leaklab"


def serve(cause: str) -> None:
    """The child: the cause's leaky app with the agent (trim allowed), on a free loopback port."""
    import importlib
    import socket

    sys.path[:0] = [ZOO, os.path.dirname(HERE)]
    import uvicorn
    from leaklab.asgi import LeaklabDebug

    app = importlib.import_module(cause).make_app("leaky")
    app.add_middleware(LeaklabDebug, allow_trim=True, census_max_seconds=30)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


def fetch(url: str, body: Any = None, method: str = "GET") -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.load(r)


def measure(cause: str, requests: int) -> dict[str, Any]:
    sys.path.insert(0, ZOO)
    import importlib

    entry = importlib.import_module(cause).ENTRY
    child = subprocess.Popen([sys.executable, __file__, "--serve", cause], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        base = f"http://127.0.0.1:{int(child.stdout.readline())}"
        start = fetch(f"{base}{P}/stats")
        for i in range(requests):
            fetch(f"{base}/predict", entry.body(i), "POST")
        before = fetch(f"{base}{P}/stats")
        probe = fetch(f"{base}{P}/trim", method="POST")
        return {
            "cause": cause,
            "requests": before["requests"],
            "collector_enabled": before["collector"]["enabled"],
            "threads": before["threads"],
            "anonymous_added_bytes": before["process"]["anonymous_bytes"] - start["process"]["anonymous_bytes"],
            "trim": probe,
        }
    finally:
        child.terminate()
        child.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("causes", nargs="*", default=["gc_disabled_cycles", "malloc_retention"])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    print(json.dumps([measure(c, args.requests) for c in args.causes], indent=1))


if __name__ == "__main__":
    main()

"""What the agent's native trace costs, on the zoo's oneDNN cause (a new image size a request).

    python crates/cli/python/bench/native_window.py [--runs 3] [--requests 100]

Serves ``lab/zoo/onednn_cache.py``'s leaky variant on loopback with
``LeaklabDebug(native_max_seconds=60)``, then per run sends ``--requests`` new-shape requests
untraced, the same number again inside ``POST /debug/leaklab/native?requests=N`` (memray's
native tracer on), and the same number untraced once more, one at a time. Prints one JSON
document: per run the three windows' seconds, memray's capture size, the time the agent took to
read it, the live bytes the window left and the stacks it named (docs/benchmarks.md quotes it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SERVE = os.path.join(HERE, "..", "..", "..", "..", "lab", "zoo", "serve.py")


def post(url: str, data: bytes = b"") -> bytes:
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        body: bytes = r.read()
        return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    n, warmup = args.requests, 20
    with tempfile.TemporaryDirectory() as folder:
        count = warmup + 3 * n * args.runs
        subprocess.run(
            [sys.executable, SERVE, "onednn_cache", "--bodies", folder, "--count", str(count)],
            check=True,
        )
        bodies = [open(os.path.join(folder, f), "rb").read() for f in sorted(os.listdir(folder))]
    service = subprocess.Popen(
        [sys.executable, SERVE, "onednn_cache", "--variant", "leaky", "--native-seconds", "60"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert service.stdout is not None
        base = service.stdout.readline().split("listening on ")[1].strip()
        sent = 0

        def send(k: int) -> float:
            nonlocal sent
            start = time.perf_counter()
            for body in bodies[sent : sent + k]:
                post(f"{base}/predict", body)
            sent += k
            return time.perf_counter() - start

        send(warmup)
        runs: list[dict[str, Any]] = []
        for _ in range(args.runs):
            before = send(n)
            doc: dict[str, Any] = {}

            def trace(into: dict[str, Any] = doc) -> None:
                url = f"{base}/debug/leaklab/native?requests={n}&seconds=60"
                into.update(json.loads(post(url)))

            window = threading.Thread(target=trace)
            window.start()
            time.sleep(0.5)  # the tracer starts before the traced requests go out
            traced = send(n)
            window.join()
            after = send(n)
            runs.append(
                {
                    "untraced_before_s": round(before, 3),
                    "traced_s": round(traced, 3),
                    "untraced_after_s": round(after, 3),
                    "window_s": doc.get("seconds"),
                    "requests": doc.get("requests"),
                    "capture_bytes": doc.get("capture_bytes"),
                    "read_s": doc.get("read_seconds"),
                    "live_bytes": doc.get("live_bytes"),
                    "rss_anon_growth_bytes": doc.get("rss_anon_growth_bytes"),
                    "stacks": doc.get("stacks_total"),
                    "top_mechanism": (doc.get("holders") or [{}])[0].get("mechanism"),
                    "note": doc.get("note"),
                }
            )
        print(json.dumps({"cause": "onednn_cache", "requests": n, "runs": runs}, indent=1))
    finally:
        service.kill()
        service.wait()


if __name__ == "__main__":
    main()

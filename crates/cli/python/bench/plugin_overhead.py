"""What one ``leak_check`` adds to a test, part by part, in a process like a test session's.

    python crates/cli/python/bench/plugin_overhead.py --repeat 5

Imports torch, FastAPI and pytest (the objects a real test session holds), then times, each
``--repeat`` times (median, min and max printed):

- a check of a function that does nothing (the fixed cost of a passing check: a young
  collection, 330 samples, the judge), with torch imported and, in a subprocess, without it;
- a check of a function that keeps a 2 kB tensor a call (a failing check: adds two censuses
  around 100 further calls, and the judge again);
- a file of six small leak tests (three keep 2 kB a call, three keep nothing; each call a
  512 -> 512 ``Linear`` on a batch of 8; the fixture's default call counts), one pytest session
  a process as a user runs it, against a plain loop of the same calls in that process, and the
  same file under pytest with ``leak_check`` a fixture that only makes its calls and the plugin
  not loaded (pytest's own session: the floor under any plugin);
- the parts alone: one full census, one tally, one ``gc.collect()`` with and without the
  collector frozen, one ``leaklab judge`` subprocess on a 300-call request.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

NO_TORCH = """
import sys, time, json
sys.modules["torch"] = None
from leaklab.pytest_plugin import check
out = []
for _ in range({repeat}):
    r = check(lambda: None)
    out.append(r.seconds["total"] - r.seconds["calls"] - r.seconds["warmup"])
print(json.dumps(out))
"""


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def _time(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds >= 0.001 else f"{seconds * 1e6:.0f} µs"


def line(what: str, values: list[float]) -> None:
    print(f"| {what} | {_time(statistics.median(values))} | {_time(min(values))} | {_time(max(values))} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="also write the figures to this file (cargo xtask bench)")
    args = parser.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    import fastapi.testclient  # noqa: F401
    import pytest  # noqa: F401
    import torch
    from leaklab import _signals, find_leaklab_bin
    from leaklab.census import census
    from leaklab.pytest_plugin import check

    torch.set_num_threads(1)
    x = torch.randn(8, 64)
    kept: list[Any] = []
    print(
        f"{len(gc.get_objects()):,} objects tracked by the collector; torch {torch.__version__}; "
        f"judge: {find_leaklab_bin()}.\n"
    )
    print("| what | median | min | max |")
    print("|---|---|---|---|")

    parts: dict[str, dict[str, list[float]]] = {}

    def added(fn: Callable[[], object], what: str) -> list[float]:
        out = []
        for _ in range(args.repeat):
            r = check(fn)
            out.append(r.seconds["total"] - r.seconds["calls"] - r.seconds["warmup"])
            for k, v in r.seconds.items():
                parts.setdefault(what, {}).setdefault(k, []).append(v)
        return out

    line("check of a no-op, torch imported: time added", added(lambda: None, "no-op"))
    line("check of a 2 kB-a-call leak: time added (two censuses)", added(lambda: kept.append(x * 2), "leak"))
    kept.clear()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([p for p in sys.path if p])}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", NO_TORCH.format(repeat=args.repeat)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    line("check of a no-op, no torch (subprocess): time added", json.loads(done.stdout))
    gc.collect()
    line("one full census", timed(census, args.repeat))
    line("one gc.collect(), not frozen", timed(gc.collect, args.repeat))
    gc.freeze()
    tallier = _signals.Tallier(torch)
    gc.unfreeze()
    tallier.remember()
    gc.freeze()
    line("one gc.collect(), frozen", timed(gc.collect, args.repeat * 20))
    line("one tally, frozen", timed(tallier.tally, args.repeat * 20))
    line("one RssAnon read", timed(_signals.anonymous_bytes, args.repeat * 20))
    gc.unfreeze()
    calls = range(30, 330)
    request = {
        "warmup": 30,
        "calls": 300,
        "series": [
            {"name": "tensors (bytes)", "kind": "exact", "samples": [[i, 1000 + 2048 * i] for i in calls]},
            {"name": "anonymous memory", "kind": "noisy", "samples": [[i, 10**8 + 4096 * (i // 7)] for i in calls]},
        ],
    }
    binary = find_leaklab_bin()
    body = json.dumps(request).encode()
    line(
        "one `leaklab judge` subprocess (300-call request)",
        timed(lambda: subprocess.run([binary, "judge", "-", "--json"], input=body, capture_output=True), args.repeat),
    )
    print("\nWhere a check's time went (median seconds over the repeats):\n")
    for what, seconds in parts.items():
        print(f"- {what}: " + ", ".join(f"{k} {statistics.median(v):.4f}" for k, v in seconds.items()))
    six = six_tests(args.repeat)
    print(
        f"\nSix small leak tests: pytest {six['pytest_seconds']:.2f} s, the plain loop of the same calls "
        f"{six['loop_seconds']:.2f} s: {six['ratio']:.2f}x (medians of {args.repeat} side by side); "
        f"pytest alone (the calls in a plain fixture, no plugin) {six['pytest_plain_seconds']:.2f} s: "
        f"{six['plain_ratio']:.2f}x"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "repeat": args.repeat,
                    "parts": {w: {k: statistics.median(v) for k, v in s.items()} for w, s in parts.items()},
                    "six": six,
                },
                f,
            )


SIX = """
import torch

torch.set_num_threads(1)
MODEL = torch.nn.Linear(512, 512)
X = torch.randn(8, 512)
KEPT = []


def call(keep):
    with torch.no_grad():
        out = MODEL(X)
    if keep:
        KEPT.append(out[0].clone())  # 512 float32: 2 kB a call


def test_keeps_a(leak_check):
    leak_check(lambda: call(True))


def test_keeps_b(leak_check):
    leak_check(lambda: call(True))


def test_keeps_c(leak_check):
    leak_check(lambda: call(True))


def test_clean_a(leak_check):
    leak_check(lambda: call(False))


def test_clean_b(leak_check):
    leak_check(lambda: call(False))


def test_clean_c(leak_check):
    leak_check(lambda: call(False))
"""


# ``leak_check`` as a plain fixture: the same calls (30 + 300), no samples, no verdict.
PLAIN_CONFTEST = """
import pytest


@pytest.fixture
def leak_check():
    def check(f):
        for _ in range(330):
            f()

    return check
"""


# One pytest session as a user runs one, in a process of its own: torch imported first (its
# import is not the plugin's cost), the plain loop of the same calls timed twice (the first warms
# torch's kernels), then the session. A session run again in the process that ran one before
# would carry the first one's kept tensors (the module's KEPT lists outlive sys.modules) into
# every later check.
SESSION = """
import json, os, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
import pytest

torch.set_num_threads(1)
model, x, kept = torch.nn.Linear(512, 512), torch.randn(8, 512), []


def loop():
    t = time.perf_counter()
    for keep in (True, True, True, False, False, False):
        for _ in range(330):
            with torch.no_grad():
                out = model(x)
            if keep:
                kept.append(out[0].clone())
    kept.clear()
    return time.perf_counter() - t


loop()
seconds = loop()
t = time.perf_counter()
code = pytest.main(sys.argv[1:])
print(json.dumps({"pytest": time.perf_counter() - t, "loop": seconds, "code": int(code)}))
"""


def six_tests(repeat: int) -> dict[str, Any]:
    """The file of six tests under pytest with the plugin, the same file with ``leak_check`` a
    plain fixture and the plugin not loaded, each in a process of its own beside the plain loop
    of the same calls (6 x 330) in that process, alternately, ``repeat`` times each; medians."""
    import importlib.metadata
    import tempfile

    def test_file(files: dict[str, str]) -> str:
        """A new folder holding ``files`` (name: text); the path of its test_six.py."""
        folder = tempfile.mkdtemp(prefix="leaklab-six-")
        for name, text in files.items():
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        return os.path.join(folder, "test_six.py")

    path = test_file({"test_six.py": SIX})
    plain = test_file({"test_six.py": SIX, "conftest.py": PLAIN_CONFTEST})
    # The plugin as pip registers it (the wheel's pytest11 entry point), else by name.
    registered = any(ep.value == "leaklab.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11"))
    load = (
        [] if registered and not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") else ["-p", "leaklab.pytest_plugin"]
    )
    quiet = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([p for p in sys.path if p])}

    def session(args: list[str]) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", SESSION, *quiet, *args], capture_output=True, text=True, env=env, check=False
        )
        last = done.stdout.strip().splitlines()[-1:] or ["(nothing)"]
        try:
            return dict(json.loads(last[0]))
        except ValueError:
            raise RuntimeError(
                f"a pytest session gave no figures: {done.stdout[-2000:]}{done.stderr[-2000:]}"
            ) from None

    runs: list[dict[str, Any]] = []
    plains: list[dict[str, Any]] = []
    for _ in range(repeat):
        runs.append(session([*load, path]))
        plains.append(session(["-p", "no:leaklab", plain]))
        if plains[-1]["code"] != 0:  # a floor from a file that did not run is no floor
            raise RuntimeError(f"the six tests without the plugin exited {plains[-1]['code']}")
    outcomes = [r["code"] for r in runs]
    if any(code != 1 for code in outcomes):  # three tests leak: pytest exits 1 (tests failed)
        raise RuntimeError(f"the six tests with the plugin exited {outcomes}, not 1 (three failures) each time")
    return {
        "pytest_seconds": statistics.median(r["pytest"] for r in runs),
        "pytest_plain_seconds": statistics.median(r["pytest"] for r in plains),
        "loop_seconds": statistics.median(r["loop"] for r in runs),
        "ratio": statistics.median(r["pytest"] / r["loop"] for r in runs),
        "plain_ratio": statistics.median(r["pytest"] / r["loop"] for r in plains),
        "exit_codes": outcomes,
    }


if __name__ == "__main__":
    main()

"""leak_check beside pytest-memray's limit_leaks, on the same test functions: right outcomes and time added.

    python crates/cli/python/bench/compare_memray.py            # every case, a markdown table
    python crates/cli/python/bench/compare_memray.py --runs 3   # each session three times: min time

Each case is a function made fresh by a fixture (outside what memray tracks) and called 330
times. Three sessions run the same cases as separate pytest processes:

- plain: the body calls the function 330 times (what the test costs without a check);
- memray: the same body under ``@pytest.mark.limit_leaks("1 KB")`` with ``--memray``, the
  anchor of issue 27 (pytest-memray reports allocations made during the test and not freed);
- leak_check: ``leak_check(fn)`` with its defaults (30 warm-up calls, 300 judged).

An outcome is right when a leaking case fails and a clean one passes. The time memray adds is
the test's time (junit XML: setup, call and teardown) minus the plain session's; the time
leak_check adds is its own account (the check's time minus the 330 calls'), which the
function's own run-to-run variance (a TestClient request: 3 to 20 ms here) does not blur. Both
are the minimum over ``--runs``. pytest-memray is needed for this comparison only: ``pip install pytest-memray``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

#: (name, leaks, what it is). The first eight are DESIGN.md's anchor cases.
CASES: list[tuple[str, bool, str]] = [
    ("outputs_kept", True, "outputs kept in a list (2 kB a call)"),
    ("graph_accumulated", True, "loss += model(x).sum(): graphs kept alive (8 kB a call)"),
    ("lru_unbounded", True, "an unbounded lru_cache keyed by call (256 B a call)"),
    ("kib_a_call", True, "a 1 KiB tensor kept a call"),
    ("deque_bounded", False, "outputs in a deque(maxlen=16)"),
    ("inference_scratch", False, "inference-mode scratch, freed"),
    ("fixed_keys_cache", False, "an lru_cache(16) of 8 keys (4 kB tensors)"),
    ("training_step", False, "a training step with Adam (state made by the first step)"),
    ("dict_by_call", True, "a dict of outputs keyed by call (2 kB a call)"),
    ("python_objects", True, "a 16 KiB bytearray kept a call (no tensor)"),
    ("state_made_once", False, "a 1 MiB table made by the first call, kept"),
    ("ring_fills_late", False, "a deque(maxlen=100): full 70 calls after the warm-up"),
    ("churn", False, "1 MiB of tensors and 500 dicts made and freed a call"),
    ("client_leaky", True, "FastAPI TestClient: the handler keeps its output"),
    ("client_clean", False, "FastAPI TestClient: inference-mode handler"),
]
CALLS = 330  # the plain and memray bodies: leak_check's 30 warm-up calls plus 300 judged

CASES_MODULE = """
import collections
import functools
import itertools

import torch

try:  # imported here, not in the first client case, so that no case's time holds an import
    import fastapi
    from fastapi.testclient import TestClient
except ImportError:
    fastapi = None

torch.manual_seed(0)
torch.set_num_threads(1)


def model():
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))


def make(name):
    m, x = model(), torch.randn(8, 64)
    counter = itertools.count()

    def forward():
        with torch.no_grad():
            return m(x)

    if name == "outputs_kept":
        kept = []
        return lambda: kept.append(forward())
    if name == "graph_accumulated":
        class Running:
            loss = 0.0

        def step():
            Running.loss += m(x).sum()

        return step
    if name == "lru_unbounded":
        cached = functools.lru_cache(maxsize=None)(lambda key: torch.randn(64))
        return lambda: cached(next(counter))
    if name == "kib_a_call":
        kept = []
        return lambda: kept.append(torch.empty(256))
    if name == "deque_bounded":
        ring = collections.deque(maxlen=16)
        return lambda: ring.append(forward())
    if name == "inference_scratch":
        def scratch():
            with torch.inference_mode():
                return float(m(x).softmax(-1).max())

        return scratch
    if name == "fixed_keys_cache":
        by_key = functools.lru_cache(maxsize=16)(lambda key: torch.randn(1024))
        keys = itertools.cycle(range(8))
        return lambda: by_key(next(keys))
    if name == "training_step":
        optimizer = torch.optim.Adam(m.parameters(), lr=1e-3)

        def step():
            optimizer.zero_grad()
            m(x).pow(2).mean().backward()
            optimizer.step()

        return step
    if name == "dict_by_call":
        cache = {}

        def call():
            cache[next(counter)] = forward()

        return call
    if name == "python_objects":
        blobs = []
        return lambda: blobs.append(bytearray(16384))
    if name == "state_made_once":
        state = {}

        def call():
            if "table" not in state:
                state["table"] = torch.zeros(1 << 18)
            return forward()

        return call
    if name == "ring_fills_late":
        ring = collections.deque(maxlen=100)
        return lambda: ring.append(forward())
    if name == "churn":
        def churn():
            big = [torch.randn(256, 256) for _ in range(4)]
            junk = {i: [i] * 16 for i in range(500)}
            return sum(float(b[0, 0]) for b in big) + len(junk)

        return churn
    if name in ("client_leaky", "client_clean"):
        if fastapi is None:
            import pytest

            pytest.skip("fastapi is not installed")
        app = fastapi.FastAPI()
        history = []

        @app.post("/predict")
        def predict(body: dict):
            with torch.inference_mode():
                y = m(torch.tensor(body["x"]))
            if name == "client_leaky":
                history.append(y)
            return {"y": y.sum().item()}

        client = TestClient(app)
        client.__enter__()
        payload = {"x": x.tolist()}
        return lambda: client.post("/predict", json=payload)
    raise ValueError(name)
"""

CONFTEST = """
import pytest
import warnings

import cases

warnings.filterwarnings("ignore")


@pytest.fixture
def fn(request):
    return cases.make(request.param)
"""

BODIES = {
    "plain": """
import pytest

NAMES = {names!r}


@pytest.mark.parametrize("fn", NAMES, indirect=True)
def test_case(fn):
    for _ in range({calls}):
        fn()
""",
    "memray": """
import pytest

NAMES = {names!r}


@pytest.mark.limit_leaks("1 KB")
@pytest.mark.parametrize("fn", NAMES, indirect=True)
def test_case(fn):
    for _ in range({calls}):
        fn()
""",
    "leak_check": """
import pytest

NAMES = {names!r}


@pytest.mark.parametrize("fn", NAMES, indirect=True)
def test_case(fn, leak_check, record_property):
    try:
        leak_check(fn)
    finally:
        seconds = leak_check.reports[-1].seconds
        record_property("added", seconds["total"] - seconds["calls"] - seconds["warmup"])
""",
}


def _plugin_args(session: str) -> list[str]:
    if session == "memray":
        return ["--memray", "-p", "no:leaklab"]
    if session == "leak_check":
        installed = any(ep.value == "leaklab.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11"))
        return ["-p", "no:memray"] + ([] if installed else ["-p", "leaklab.pytest_plugin"])
    return ["-p", "no:memray", "-p", "no:leaklab"]


def run(session: str, names: list[str], folder: Path) -> tuple[dict[str, tuple[str, float]], float]:
    """One pytest process: each case's outcome and time (junit XML), and the session's wall time."""
    test = folder / f"test_{session}.py"
    test.write_text(textwrap.dedent(BODIES[session].format(names=names, calls=CALLS)))
    xml = folder / f"{session}.xml"
    path = [str(folder), _package_root(), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    started = time.perf_counter()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", str(test)]
    subprocess.run(
        [*command, *_plugin_args(session)],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    wall = time.perf_counter() - started
    results: dict[str, tuple[str, float]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name", "").split("[", 1)[-1].rstrip("]")
        outcome = "fail" if case.find("failure") is not None or case.find("error") is not None else "pass"
        if case.find("skipped") is not None:
            outcome = "skip"
        seconds = float(case.get("time", "0"))
        # leak_check says what it added itself (the test's time minus its calls'): steadier than
        # a difference of two sessions, where the function's own time varies.
        for prop in case.iter("property"):
            if prop.get("name") == "added":
                seconds = float(prop.get("value", "0"))
        results[name] = (outcome, seconds)
    return results, wall


def _package_root() -> str:
    spec = importlib.util.find_spec("leaklab")
    if spec is None or spec.origin is None:
        return str(Path(__file__).resolve().parents[1])
    return str(Path(spec.origin).resolve().parents[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="sessions of each kind; times are the minimum")
    parser.add_argument("--case", action="append", help="only these cases (repeat)")
    args = parser.parse_args()
    if importlib.util.find_spec("pytest_memray") is None:
        sys.exit("pytest-memray is not installed in this Python: pip install pytest-memray (for this comparison only)")
    names = [c[0] for c in CASES if not args.case or c[0] in args.case]
    with tempfile.TemporaryDirectory(prefix="leaklab-memray-") as tmp:
        folder = Path(tmp)
        (folder / "cases.py").write_text(CASES_MODULE)
        (folder / "conftest.py").write_text(CONFTEST)
        best: dict[str, dict[str, tuple[str, float]]] = {}
        walls: dict[str, list[float]] = {}
        outcomes: dict[str, dict[str, set[str]]] = {}
        for _ in range(args.runs):
            for session in ("plain", "memray", "leak_check"):
                results, wall = run(session, names, folder)
                walls.setdefault(session, []).append(wall)
                for name, (outcome, seconds) in results.items():
                    outcomes.setdefault(session, {}).setdefault(name, set()).add(outcome)
                    kept = best.setdefault(session, {}).get(name)
                    if kept is None or seconds < kept[1]:
                        best.setdefault(session, {})[name] = (outcome, seconds)
    right = {"memray": 0, "leak_check": 0}
    print(f"{CALLS} calls a case; times are the minimum of {args.runs} session(s) of each kind.\n")
    print('| case | leaks? | plain | memray `limit_leaks("1 KB")` | time added | `leak_check` | time added |')
    print("|---|---|---|---|---|---|---|")
    for name, leaks, what in CASES:
        if name not in names:
            continue
        if any(best[s][name][0] == "skip" for s in best):
            print(f"| {what} | {'yes' if leaks else 'no'} | skipped (fastapi is not installed) | | | | |")
            continue
        plain = best["plain"][name][1]
        cells = []
        for session in ("memray", "leak_check"):
            seen = outcomes[session][name]
            outcome = "/".join(sorted(seen))
            ok = seen == {"fail" if leaks else "pass"}
            right[session] += ok
            added = best[session][name][1] - (plain if session == "memray" else 0.0)
            cells += [f"{outcome} {'✓' if ok else '✗'}", f"+{added:.2f} s"]
        print(f"| {what} | {'yes' if leaks else 'no'} | {plain:.2f} s | " + " | ".join(cells) + " |")
    print(
        f"\nRight outcomes: memray {right['memray']}/{len(names)}, leak_check {right['leak_check']}/{len(names)}. "
        "Session wall times (min): " + ", ".join(f"{s} {min(w):.1f} s" for s, w in walls.items()) + "."
    )


if __name__ == "__main__":
    main()

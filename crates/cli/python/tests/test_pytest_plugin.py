"""The ``leak_check`` fixture and marker in real pytest sessions (pytester), as a user runs them.

Every leak the seed names fails, with its holder and its bytes per call in the message; every
clean case a naive check gets wrong (state made once, buffers full after the warm-up, heavy
churn, a training step) passes. The sessions run in this process (``inline_run``: torch is
imported once); the one without torch runs in a subprocess that cannot import it.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from typing import Any

import leaklab
import pytest
import torch
from leaklab import _signals, pytest_plugin
from leaklab._find_bin import find_leaklab_bin
from leaklab.pytest_plugin import ANONYMOUS, TENSOR_BYTES, check

pytest_plugins = ["pytester"]

# The test functions of the sessions below share this preamble: a small model whose output
# (8 x 64 float32) is 2,048 bytes. Most checks use the defaults (300 calls after 30).
PREAMBLE = """
import collections
import functools
import itertools

import pytest
import torch

torch.manual_seed(0)
torch.set_num_threads(1)  # two shared cores in CI: intra-op threads would only wait on each other
MODEL = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
X = torch.randn(8, 64)
COUNTER = itertools.count()


def forward():
    with torch.no_grad():
        return MODEL(X)
"""

LEAKS = """
KEPT = []


def test_outputs_kept(leak_check):
    leak_check(lambda: KEPT.append(forward()))


class Running:
    loss = 0.0


def test_graph_kept_alive(leak_check):
    def step():
        Running.loss += MODEL(X).sum()  # every call's graph hangs off one tensor

    leak_check(step)


CACHE = {}


def test_unbounded_cache_keyed_by_call(leak_check):
    def call():
        CACHE[next(COUNTER)] = forward()

    leak_check(call)


@functools.lru_cache(maxsize=None)
def embed(key):
    return torch.randn(64)


def test_unbounded_lru_cache(leak_check):
    leak_check(lambda: embed(next(COUNTER)))


SMALL = []


def test_a_kibibyte_a_call(leak_check):
    leak_check(lambda: SMALL.append(torch.empty(256)))


TINY = []


def test_sixty_four_bytes_a_call(leak_check):
    leak_check(lambda: TINY.append(torch.empty(16)))


MARKED = []


@pytest.mark.leak_check(calls=200, warmup=20)
def test_marked_body_keeps_outputs():
    MARKED.append(forward())


BLOBS = []


def test_python_objects_not_tensors(leak_check):
    leak_check(lambda: BLOBS.append(bytearray(16384)))


def test_a_budget_fails_a_faster_growth(leak_check):
    kept = []
    leak_check(lambda: kept.append(torch.empty(4096)), max_per_call="4 KiB")
"""

CLEAN = """
STATE = {}


def test_state_made_once_and_kept(leak_check):
    def call():
        if "table" not in STATE:
            STATE["table"] = torch.zeros(1 << 18)  # 1 MiB, made by the first call
        return forward()

    leak_check(call)


def test_a_ring_buffer_full_during_the_warmup(leak_check):
    ring = collections.deque(maxlen=16)
    leak_check(lambda: ring.append(forward()))


def test_a_ring_buffer_that_fills_after_the_warmup_then_stops(leak_check):
    ring = collections.deque(maxlen=100)  # full 70 calls into the 300 judged
    leak_check(lambda: ring.append(forward()))


@functools.lru_cache(maxsize=16)
def by_key(key):
    return torch.randn(1024)


def test_a_cache_of_fixed_keys(leak_check):
    keys = itertools.cycle(range(8))
    leak_check(lambda: by_key(next(keys)))


def test_allocates_and_frees_heavily(leak_check):
    def churn():
        big = [torch.randn(256, 256) for _ in range(4)]  # 1 MiB of tensors
        junk = {i: [i] * 16 for i in range(500)}  # and Python objects, all freed
        return sum(float(b[0, 0]) for b in big) + len(junk)

    leak_check(churn)


def test_a_training_step_with_an_optimizer(leak_check):
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)  # its state is made by the first step

    def step():
        optimizer.zero_grad()
        loss = model(X).pow(2).mean()
        loss.backward()
        optimizer.step()

    leak_check(step, calls=100, warmup=10)


def test_inference_mode_scratch(leak_check):
    def call():
        with torch.inference_mode():
            scratch = torch.empty(64, 1024)
            scratch.fill_(1.0)
            return float(MODEL(X).softmax(-1).max() + scratch[0, 0])

    leak_check(call)


def test_the_last_output_with_its_graph_replaced_each_call(leak_check):
    class Service:
        last = None

    def call():
        Service.last = MODEL(X)  # one graph alive at a time

    leak_check(call)


def test_prints_and_logs_every_call(leak_check):
    # pytest keeps what it captures (the output, the log records) until the test ends.
    import logging

    log = logging.getLogger("service")
    n = iter(range(10**9))

    def handle():
        i = next(n)
        print(f"handled request {i}: " + "x" * 200)
        log.warning("request %d took %.1f ms", i, 1.5)

    leak_check(handle)


@pytest.mark.leak_check(calls=200, warmup=20)
def test_marked_body_keeps_nothing():
    forward()


def test_a_budget_lets_a_slower_growth_pass(leak_check):
    kept = []
    leak_check(lambda: kept.append(torch.empty(256)), max_per_call="4 KiB")
"""


def _plugin_args() -> list[str]:
    """``-p leaklab.pytest_plugin`` where the wheel's entry point does not load the plugin already."""
    autoload = not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    installed = any(ep.value == "leaklab.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if autoload and installed else ["-p", "leaklab.pytest_plugin"]


def _run(pytester: pytest.Pytester, body: str) -> dict[str, Any]:
    """Runs ``body`` (after the preamble) as test_cases.py; each test's report by name."""
    pytester.makepyfile(test_cases=PREAMBLE + body)
    recorder = pytester.inline_run(*_plugin_args(), "-p", "no:cacheprovider", "-p", "no:randomly")
    return {r.head_line: r for r in recorder.getreports("pytest_runtest_logreport") if r.when == "call"}


def _check(reports: dict[str, Any], name: str, outcome: str, *expected: str) -> None:
    report = reports[name]
    text = report.longreprtext
    assert report.outcome == outcome, f"{name}: expected {outcome}, got {report.outcome}:\n{text}"
    for line in expected:
        assert line in text, f"{name}: {line!r} is not in the failure message:\n{text}"


def test_every_leak_fails_and_names_its_holder_and_bytes_per_call(pytester: pytest.Pytester) -> None:
    reports = _run(pytester, LEAKS)
    # The diagnosis first, in the scan's words: verdict, axis, owner (the holder's path from its
    # root, with the census's share of the fastest failing series: the tensors' 2.05 kB, or the
    # anonymous memory's 4 to 5 kB with the list's and the tensors' objects), mechanism, fix.
    _check(
        reports,
        "test_outputs_kept",
        "failed",
        "verdict:   FAIL: a leak is proven (",
        "axis:      per call: ",
        " a call over 300 calls of the same function, to the last: every call adds\n"
        "owner:     python: the census holds 2.05 kB of ",
        " a call: `test_cases.KEPT` (module global) grew most\n"
        "mechanism: a Python holder reachable from a root keeps what each call leaves\n"
        "fix:       stop keeping it in `test_cases.KEPT` (drop the reference, bound it,",
        "memory leak: 300 calls judged after 30 warm-up calls, no budget: any growth proven is a leak",
        "FAIL tensors (bytes): leak at 2.05 kB (bound 2.05 kB .. 2.05 kB) per call (exact;",
        "FAIL tensors (objects): leak at 1 (bound 1 .. 1) per call",
        "who holds it (tensor census before and after 100 further calls, taken once it failed):",
        "test_cases.KEPT (module global): +100 tensors, +204.80 kB (2.05 kB per call)",
        "calls of test_outputs_kept.<locals>.<lambda> took",
    )
    # The graph: the ReLU's 8 x 256 float32 output saved each call (8,192 bytes), seven nodes.
    _check(
        reports,
        "test_graph_kept_alive",
        "failed",
        "FAIL tensors (bytes): leak at 8.19 kB (bound 8.19 kB .. 8.19 kB) per call",
        "FAIL autograd graph nodes: leak at 7 (bound 7 .. 7) per call",
        "test_cases.Running.loss (class attribute): +819.20 kB (8.19 kB per call), +700 autograd graph nodes",
        "a call: `test_cases.Running.loss` (class attribute) grew most",
    )
    _check(
        reports,
        "test_unbounded_cache_keyed_by_call",
        "failed",
        "test_cases.CACHE (module global): +100 tensors, +204.80 kB (2.05 kB per call)",
    )
    _check(reports, "test_unbounded_lru_cache", "failed", "FAIL tensors (bytes): leak at 256 B", "test_cases.embed")
    _check(
        reports,
        "test_a_kibibyte_a_call",
        "failed",
        "FAIL tensors (bytes): leak at 1.02 kB (bound 1.02 kB .. 1.02 kB) per call",
        "test_cases.SMALL (module global): +100 tensors, +102.40 kB (1.02 kB per call)",
    )
    _check(
        reports,
        "test_sixty_four_bytes_a_call",
        "failed",
        "FAIL tensors (bytes): leak at 64 B (bound 64 B .. 64 B) per call",
        "test_cases.TINY (module global): +100 tensors, +6.40 kB (64 B per call)",
    )
    _check(
        reports,
        "test_marked_body_keeps_outputs",
        "failed",
        "memory leak: 200 calls judged after 20 warm-up calls",
        "test_cases.MARKED (module global): +100 tensors, +204.80 kB (2.05 kB per call)",
        "calls of the body of test_marked_body_keeps_outputs took",
    )
    # Not tensors: only the anonymous memory sees it, at about its 16,384 bytes a call; the
    # census taken when it failed says none of it is tensors reachable from Python.
    _check(
        reports,
        "test_python_objects_not_tensors",
        "failed",
        "ok   tensors (bytes): flat at 0 B",
        "FAIL anonymous memory: leak at 1",
        "verdict:   FAIL: a leak is proven (anonymous memory leak, 1",
        "axis:      per call: anonymous memory leak at 1",
        "owner:     native: the census holds 0 B of 1",
        "the rest is not tensors reachable from Python",
        "mechanism: memory kept per call that no Python tensor holds",
        "fix:       name the allocating lines: run the test under pytest-memray",
    )
    assert "who holds it: not asked" not in reports["test_python_objects_not_tensors"].longreprtext
    _check(
        reports,
        "test_a_budget_fails_a_faster_growth",
        "failed",
        "a budget of 4.10 kB per call",
        "FAIL tensors (bytes): leak at 16.38 kB (bound 16.38 kB .. 16.38 kB) per call",
    )
    assert len(reports) == 9, sorted(reports)


def test_clean_cases_a_naive_check_gets_wrong_pass(pytester: pytest.Pytester) -> None:
    reports = _run(pytester, CLEAN)
    for name, report in sorted(reports.items()):
        assert report.outcome == "passed", f"{name} failed:\n{report.longreprtext}"
    assert len(reports) == 11, sorted(reports)


def test_without_torch_the_plugin_loads_and_judges_anonymous_memory(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A subprocess that cannot import torch (None in sys.modules makes `import torch` fail).
    pytester.makeconftest("import sys\nsys.modules['torch'] = None\n")
    pytester.makepyfile(
        test_plain="""
        BLOBS = []

        def test_keeps_64_kib_a_call(leak_check):
            leak_check(lambda: BLOBS.append(bytearray(65536)), calls=100, warmup=10)

        def test_frees_what_it_makes(leak_check):
            leak_check(lambda: bytearray(65536), calls=100, warmup=10)
        """
    )
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(leaklab.__file__)))
    pythonpath = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", pythonpath)
    result = pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*FAIL anonymous memory: leak at 6?.?? kB*per call*",
            "*Note: no tensor signals: torch is not installed in this process; anonymous memory alone was watched*",
        ]
    )
    assert "Traceback" not in result.stdout.str()


def test_marker_misuse_is_refused_in_a_sentence(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_misuse="""
        import pytest

        @pytest.mark.leak_check(calls=10, warmup=2)
        def test_both(leak_check):
            pass

        @pytest.mark.leak_check(cals=10)
        def test_typo():
            pass

        @pytest.mark.leak_check(calls=10)
        async def test_coroutine():
            pass
        """
    )
    recorder = pytester.inline_run(*_plugin_args(), "-p", "no:cacheprovider")
    reports = {r.head_line: r for r in recorder.getreports("pytest_runtest_logreport") if r.when == "call"}
    assert "use one of them" in reports["test_both"].longreprtext
    assert "not cals" in reports["test_typo"].longreprtext
    assert "synchronous test bodies" in reports["test_coroutine"].longreprtext
    assert all(r.outcome == "failed" for r in reports.values()), reports


def test_the_check_uses_no_cuda_it_was_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for torch.cuda records every call that could create a CUDA context or read the
    # allocator: while CUDA is not initialised, the check must make none of them.
    touched: list[str] = []
    for name in ("init", "_lazy_init", "device_count", "memory_allocated", "memory_stats", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, _name=name, **k: touched.append(_name) or 0)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    report = check(lambda: torch.ones(4) * 2, calls=40, warmup=5)
    assert report.passed, report.message
    assert touched == []
    assert not any(s["name"].startswith("CUDA") for s in report.request["series"])
    # Once the process uses CUDA, every device's allocator is read after each call.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 4096 * (device + 1))
    report = check(lambda: torch.ones(4) * 2, calls=40, warmup=5)
    assert report.passed, report.message
    cuda = [s for s in report.request["series"] if s["name"].startswith("CUDA")]
    assert [s["name"] for s in cuda] == ["CUDA allocated (cuda:0)", "CUDA allocated (cuda:1)"]
    assert {tuple(v for _, v in s["samples"]) for s in cuda} == {(4096,) * 40, (8192,) * 40}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_leak_fails_on_the_allocator_and_the_tensor_tally() -> None:
    kept: list[Any] = []
    x = torch.randn(8, 64, device="cuda")
    report = check(lambda: kept.append(x * 2), calls=100, warmup=10)
    assert report.outcome == "fail", report.message
    assert report.series("CUDA allocated (cuda:0)")["fails"], report.message
    assert report.series(TENSOR_BYTES)["slope"]["bytes_per_request"] == 2048, report.message
    clean = check(lambda: x * 2, calls=100, warmup=10)
    assert clean.passed, clean.message


def test_bad_arguments_are_refused_before_any_call() -> None:
    calls: list[int] = []
    for kwargs, words in [
        ({"calls": 0}, "positive number of calls"),
        ({"warmup": -1}, "zero or more calls"),
        ({"max_per_call": "4 parsecs"}, "like '4 KiB'"),
        ({"max_per_call": -1}, "zero or more bytes"),
    ]:
        with pytest.raises(ValueError, match=words):
            check(lambda: calls.append(1), **kwargs)
    with pytest.raises(TypeError, match="a function to call"):
        check(42)  # type: ignore[arg-type]
    assert calls == []


def test_a_coroutine_function_is_refused_with_the_wrapper_to_use() -> None:
    async def handler() -> None:
        pass

    with pytest.raises(TypeError, match=r"asyncio\.run\(handler\(\)\)"):
        check(handler, calls=10, warmup=1)


def test_budgets_read_as_people_write_them() -> None:
    assert pytest_plugin._as_bytes("4 KiB") == 4096
    assert pytest_plugin._as_bytes("1.5MB") == 1_500_000
    assert pytest_plugin._as_bytes(512) == 512
    assert pytest_plugin._as_bytes(None) is None


def _no_tensor_signals(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check as in a process without torch: no census before the judge is asked.

    For the cases about the judge alone: torch is imported in this process, so each of their 13
    checks would otherwise take a full census of it first, which no broken judge reads (the
    seven tests took 4.6 s of CPU with the censuses, 1.5 s without; 2026-12-06).
    """
    monkeypatch.setattr(_signals, "loaded_torch", lambda: None)


def test_a_missing_binary_is_said_with_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    _no_tensor_signals(monkeypatch)
    monkeypatch.setenv("LEAKLAB_BIN", str(tmp_path / "nothing-here"))
    with pytest.raises(pytest_plugin.JudgeError, match=r"LEAKLAB_BIN=.*nothing-here is not an executable file"):
        check(lambda: None, calls=10, warmup=1)


# Stand-ins for a judge that gives no verdict: the script, and what the test failure must say.
BROKEN_JUDGES = {
    "missing": (None, "is not an executable file"),
    "timeout": ("exec sleep 30", "judge gave no verdict within 1 s and was stopped"),
    "not json": ("echo 'thread main panicked'; exit 1", "with no verdict this plugin can read"),
    "no outcome": ("echo '{\"series\": []}'", "with no verdict this plugin can read"),
    "crash": (
        "echo 'out of memory' >&2; exit 101",
        "judge exited 101 without a verdict (0 pass, 1 fail, 2 cannot judge): out of memory",
    ),
    "signal": ("kill -9 $$", "judge was killed by signal 9 without a verdict"),
}


@pytest.mark.parametrize("broken", list(BROKEN_JUDGES))
def test_every_failure_of_the_judge_is_a_test_failure_that_says_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, broken: str
) -> None:
    script, says = BROKEN_JUDGES[broken]
    binary = tmp_path / "leaklab"
    if script is not None:
        binary.write_text(f"#!/bin/sh\ncat > /dev/null\n{script}\n")
        binary.chmod(0o755)
    monkeypatch.setenv("LEAKLAB_BIN", str(binary))
    monkeypatch.setattr(pytest_plugin, "JUDGE_TIMEOUT_SECONDS", 1.0)
    _no_tensor_signals(monkeypatch)
    # No torch in these sessions: a module torch imports lazily in one inline session (dynamo,
    # by the optimizer case) is dropped after it, and importing it again would fail.
    pytester.makepyfile(
        test_cases="""
        import pytest

        def forward():
            return [0] * 8

        def test_fixture(leak_check):
            leak_check(forward, calls=10, warmup=1)

        @pytest.mark.leak_check(calls=10, warmup=1)
        def test_marker():
            forward()
        """
    )
    recorder = pytester.inline_run(*_plugin_args(), "-p", "no:cacheprovider", "-p", "no:randomly")
    reports = {r.head_line: r for r in recorder.getreports("pytest_runtest_logreport") if r.when == "call"}
    for name in ("test_fixture", "test_marker"):
        report = reports[name]
        assert report.outcome == "failed", (name, report.outcome)
        text = report.longreprtext
        assert text.startswith("leak_check could not judge ") and says in text, text
        assert "Traceback" not in text and "Error" not in text.split(":", 1)[0], text


def test_the_anonymous_series_is_judged_against_its_noise_floor() -> None:
    report = check(lambda: None, calls=60, warmup=5)
    assert report.passed, report.message
    anon = report.series(ANONYMOUS)
    # A function that keeps nothing moves anonymous memory by less than the floor (the trim
    # before each sample hands the free heap back), so the floor is the noise it is judged with.
    # The judge's host noise floor (leaklab_judge::thresholds::HOST_NOISE_FLOOR), the scan's.
    assert anon["noise_bytes"] == 64 * 1024, anon
    assert "noise 65.54 kB, the least this signal is given" in report.message, report.message


def test_importing_the_plugin_imports_no_torch() -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", "import sys, leaklab.pytest_plugin; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(leaklab.__file__)))},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_failing_checks_evidence_is_kept_and_judged_again_alike(pytester: pytest.Pytester, tmp_path: Any) -> None:
    """Without the option a failing check's evidence goes to pytest's cache and a passing one
    writes nothing; with ``--leak-evidence DIR`` every check's goes there; ``leaklab judge FILE``
    gives the same outcome and message as the check it came from."""
    pytester.makepyfile(
        test_cases=PREAMBLE
        + """
KEPT = []


def test_keeps(leak_check):
    leak_check(lambda: KEPT.append(torch.ones(2048)), calls=120, warmup=10)


def test_keeps_nothing(leak_check):
    leak_check(lambda: torch.ones(2048).sum(), calls=120, warmup=10)
"""
    )
    cached = pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:randomly")
    cached.assert_outcomes(passed=1, failed=1)
    kept = sorted((pytester.path / ".pytest_cache" / "d" / "leaklab-evidence").glob("*.json"))
    assert [p.name for p in kept] == ["test_cases.py_test_keeps.json"], kept
    assert f"evidence: {kept[0]}" in cached.stdout.str(), cached.stdout.str()
    again = subprocess.run([find_leaklab_bin(), "judge", str(kept[0])], capture_output=True, text=True, timeout=60)
    assert again.returncode == 1, again.stderr
    assert "memory leak" in again.stdout and "KEPT" in again.stdout, again.stdout

    folder = tmp_path / "evidence"
    asked = pytester.runpytest_subprocess(
        *_plugin_args(), "-p", "no:randomly", "-p", "no:cacheprovider", f"--leak-evidence={folder}"
    )
    asked.assert_outcomes(passed=1, failed=1)
    written = sorted(p.name for p in folder.glob("*.json"))
    assert written == ["test_cases.py_test_keeps.json", "test_cases.py_test_keeps_nothing.json"], written
    clean = subprocess.run(
        [find_leaklab_bin(), "judge", str(folder / "test_cases.py_test_keeps_nothing.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert clean.returncode == 0 and clean.stdout.startswith("no leak"), clean.stdout + clean.stderr

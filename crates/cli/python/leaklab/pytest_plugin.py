"""The ``leak_check`` fixture and marker: a leak regression test for your own handlers.

Registered by the wheel's ``pytest11`` entry point, so installing ``leaklab`` is all it takes::

    def test_predict_keeps_nothing(leak_check):
        with TestClient(app) as client:
            leak_check(lambda: client.post("/predict", json=BODY), calls=300, warmup=30)

    @pytest.mark.leak_check(calls=200, warmup=20)
    def test_forward_keeps_nothing():
        model(x)

``fn`` is called ``warmup + calls`` times. Nothing is judged during the warm-up (caches fill,
pools grow, lazy state is made); after each judged call, its return value dropped and a
``gc.collect()`` run (garbage awaiting the collector is not a leak), the check samples:

- the **tensor tally**: the bytes of every tensor with a Python object (each storage once,
  plus what their autograd graphs save), how many such tensors, and how many graph nodes.
  Exact, on any device. The collector is frozen (``gc.freeze()``) through the check, so each
  collection and each tally costs what the calls made, not what the process holds.
- ``torch.cuda.memory_allocated()`` of each device, where the calls use CUDA. Exact.
- the process's **anonymous memory** (``RssAnon``): every byte of heap, tensors or not, but
  noisy (pages, pymalloc pools, glibc's arenas), so it is judged on its floor against a noise
  of at least the judge's host noise floor (64 KiB, the scan's for host memory).

Where a check fails, a full tensor census (:func:`leaklab.census.census`), ``CENSUS_CALLS``
further calls and a second census name the holders that grew; a passing check takes none. The
verdict
comes from the ``leaklab judge`` binary, the detector ``leaklab scan`` uses, in one subprocess
per check: a series fails when its growth is proven (its lower bound above zero, or above
``max_per_call``) and still going at the end; a cache that fills and stops is a plateau and
passes. docs/pytest.md has the figures: costs, the anonymous-memory rule, pytest-memray beside.
"""

from __future__ import annotations

import array
import gc
import importlib.util
import inspect
import json
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from leaklab import _signals
from leaklab._find_bin import LeaklabNotFound, find_leaklab_bin

__all__ = [
    "JudgeError",
    "LeakCheck",
    "LeakReport",
    "check",
    "leak_check",
]

#: The tally may take this share of the time the function itself takes (or TALLY_FREE_SECONDS a
#: call, whichever is more); past it, it is taken at every 2nd call, 4th, ...: evenly spaced,
#: never fewer than MIN_TALLY_POINTS points.
TALLY_SHARE = 0.25
TALLY_FREE_SECONDS = 0.0005
MIN_TALLY_POINTS = 32

#: Bound on each full census; one that stops early says so in the failure message.
CENSUS_SECONDS = 10.0
#: Calls made between the two censuses of a check that failed, to name who holds what they keep
#: (at most the check's own calls).
CENSUS_CALLS = 100
JUDGE_TIMEOUT_SECONDS = 120.0

TENSOR_BYTES = "tensors (bytes)"
TENSOR_OBJECTS = "tensors (objects)"
GRAPH_NODES = "autograd graph nodes"
ANONYMOUS = "anonymous memory"

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}


def _as_bytes(value: float | str | None) -> float | None:
    """``max_per_call`` as bytes: a number, or a string such as ``"4 KiB"`` or ``"1.5 MB"``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError("max_per_call is bytes per call (a number or a string like '4 KiB'), not a bool")
    if isinstance(value, int | float):
        number, unit = float(value), 1
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(f"max_per_call={value!r}: write bytes per call as a number or like '4 KiB', '1.5 MB'")
        number, unit = float(m.group(1)), _UNITS[m.group(2).lower()]
    if not number >= 0:
        raise ValueError(f"max_per_call must be zero or more bytes per call, not {value!r}")
    return number * unit


@dataclass
class LeakReport:
    """What one check measured and what the judge said of it."""

    outcome: str  #: ``pass``, ``fail`` or ``cannot_judge``, as ``leaklab judge`` answers
    message: str  #: the judge's message, the notes and the check's costs: what a failure prints
    calls: int
    warmup: int
    seconds: dict[str, float] = field(default_factory=dict)  #: where the time went
    answer: dict[str, Any] = field(default_factory=dict)  #: the judge's JSON answer
    request: dict[str, Any] = field(default_factory=dict)  #: the series and censuses sent to it
    evidence: str | None = None  #: where the request was written (``--leak-evidence``, or a failure)

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    def series(self, name: str) -> dict[str, Any]:
        """The judge's verdict on one series (``TENSOR_BYTES``, ``ANONYMOUS``, ...)."""
        for s in self.answer.get("series", []):
            if s["name"] == name:
                return dict(s)
        raise KeyError(f"no series {name!r} in this report: {[s['name'] for s in self.answer.get('series', [])]}")


class _Series:
    """One signal's samples, (call index, value), in two arrays of machine integers.

    The collector tracks neither array, so the tally after each call does not list the check's
    own samples: kept as ``[i, value]`` lists (four new ones a call), they were most of what each
    tally listed (1,211 objects at the 300th call of a no-op, against 15 at the first).
    """

    def __init__(self) -> None:
        self.at: array.array[int] = array.array("q")
        self.values: array.array[int] = array.array("q")

    def __len__(self) -> int:
        return len(self.at)

    def add(self, i: int, value: int) -> None:
        self.at.append(i)
        self.values.append(value)

    def keep(self, wanted: Callable[[int], bool]) -> None:
        """Keeps the samples whose call index is ``wanted``."""
        kept = [(i, v) for i, v in zip(self.at, self.values, strict=True) if wanted(i)]
        self.at = array.array("q", (i for i, _ in kept))
        self.values = array.array("q", (v for _, v in kept))

    def samples(self) -> list[list[int]]:
        """The samples as the judge's request has them: ``[[i, value], ...]``."""
        return [[i, v] for i, v in zip(self.at, self.values, strict=True)]


class _Sampler:
    """The samples after each judged call (see the module docs)."""

    def __init__(self, torch: Any, devices: list[int], warmup: int, calls: int) -> None:
        self.torch, self.devices, self.warmup = torch, devices, warmup
        self.tallier = _signals.Tallier(torch) if torch is not None else None
        self.max_stride = max(1, calls // MIN_TALLY_POINTS)
        self.stride = 1
        self.anon = _Series()
        self.cuda = {d: _Series() for d in devices}
        self.held = _Series()
        self.tensors = _Series()
        self.nodes = _Series()
        self.calls = 0
        self.fn_seconds = 0.0
        self.spent = {"collect": 0.0, "anonymous": 0.0, "cuda": 0.0, "tally": 0.0}
        self.trimmed = False  # whether malloc_trim handed the free heap back (glibc only)

    def sample(self, i: int, fn_seconds: float) -> None:
        clock = time.perf_counter
        self.calls += 1
        self.fn_seconds += fn_seconds
        t0 = clock()
        gc.collect()
        t1 = clock()
        # Free heap handed back before each sample: a leak cannot fill it unseen, and a clean
        # function whose scratch (a 256 kB tensor) lands at a new place in glibc's heap now and
        # then does not leave the freed space counted (trimmed once only, such steps read as a
        # slope: a false alarm in CI).
        self.trimmed = _signals.return_free_heap()
        anon = _signals.anonymous_bytes()
        if anon is not None:
            self.anon.add(i, anon)
        t2 = clock()
        for d in self.devices:
            self.cuda[d].add(i, _signals.cuda_allocated(self.torch, d))
        t3 = clock()
        self.spent["collect"] += t1 - t0
        self.spent["anonymous"] += t2 - t1
        self.spent["cuda"] += t3 - t2
        if self.tallier is not None and (i - self.warmup) % self.stride == 0:
            tally = self.tallier.tally()
            self.held.add(i, tally.held)
            self.tensors.add(i, tally.tensors)
            self.nodes.add(i, tally.graph_nodes)
            cost = clock() - t3
            self.spent["tally"] += cost
            self.pace(cost)

    def pace(self, cost: float) -> None:
        """Spreads the tally out when it costs more than its share (its cost grows with a leak)."""
        allowance = max(TALLY_SHARE * self.fn_seconds / self.calls, TALLY_FREE_SECONDS)
        thinned = False
        while cost / self.stride > allowance and self.stride * 2 <= self.max_stride:
            self.stride *= 2
            thinned = True
        if thinned:
            for series in (self.held, self.tensors, self.nodes):
                series.keep(lambda i: (i - self.warmup) % self.stride == 0)

    def series(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.torch is not None:
            out.append({"name": TENSOR_BYTES, "kind": "exact", "samples": self.held.samples()})
            out.append(
                {"name": TENSOR_OBJECTS, "kind": "exact", "samples": self.tensors.samples(), "counts": "tensors"}
            )
            out.append({"name": GRAPH_NODES, "kind": "exact", "samples": self.nodes.samples(), "counts": "graph nodes"})
        for d, samples in self.cuda.items():
            out.append({"name": f"CUDA allocated (cuda:{d})", "kind": "exact", "samples": samples.samples()})
        if self.anon:
            # Judged against the judge's host noise floor, the scan's (docs/pytest.md).
            out.append({"name": ANONYMOUS, "kind": "noisy", "samples": self.anon.samples()})
        return out


class _Freezer:
    """``gc.freeze()`` and ``gc.unfreeze()``, done only where the check froze nothing else."""

    def __init__(self, ours: bool) -> None:
        self.ours = ours
        self.frozen = False

    def freeze(self) -> None:
        if self.ours and not self.frozen:
            gc.freeze()
            self.frozen = True

    def thaw(self) -> None:
        if self.frozen:
            gc.unfreeze()
            self.frozen = False


def _call(fn: Callable[[], object]) -> None:
    """Calls ``fn`` and drops what it returns before anything is sampled."""
    result = fn()
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(
            f"leak_check calls {_name(fn)} synchronously and it returned an awaitable: "
            "check a coroutine function through a wrapper, e.g. lambda: asyncio.run(handler())"
        )


def _name(fn: Callable[[], object]) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def _census() -> tuple[Any, str | None]:
    from leaklab.census import CensusError, census

    try:
        return census(max_seconds=CENSUS_SECONDS), None
    except CensusError as e:
        return None, f"no tensor census: {e}"


class JudgeError(RuntimeError):
    """``leaklab judge`` gave no verdict: no binary, a timeout, a crash, an answer it cannot read.

    :func:`check` raises it; the fixture and the marker turn it into a test failure that says it.
    """


_OUTCOMES = ("pass", "fail", "cannot_judge")


def _judge(request: dict[str, Any]) -> dict[str, Any]:
    """One ``leaklab judge - --json`` subprocess: the verdict, by the detector ``scan`` uses."""
    try:
        binary = find_leaklab_bin()
    except LeaklabNotFound as e:
        raise JudgeError(f"leak_check needs the leaklab binary to judge the series it measured: {e}") from None
    try:
        done = subprocess.run(
            [binary, "judge", "-", "--json"],
            input=json.dumps(request).encode(),
            capture_output=True,
            timeout=JUDGE_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise JudgeError(
            f"{binary} judge gave no verdict within {JUDGE_TIMEOUT_SECONDS:g} s and was stopped "
            "(leaklab.pytest_plugin.JUDGE_TIMEOUT_SECONDS); a judgement takes milliseconds, so the binary is stuck"
        ) from None
    except OSError as e:
        raise JudgeError(f"{binary} judge could not be started: {e}") from None
    said = done.stderr.decode(errors="replace").strip()[-2000:] or "(nothing on stderr)"
    if done.returncode < 0:
        raise JudgeError(f"{binary} judge was killed by signal {-done.returncode} without a verdict: {said}")
    if done.returncode not in (0, 1, 2):
        raise JudgeError(
            f"{binary} judge exited {done.returncode} without a verdict (0 pass, 1 fail, 2 cannot judge): {said}"
        )
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        answer = None
    if (
        not isinstance(answer, dict)
        or answer.get("outcome") not in _OUTCOMES
        or not isinstance(answer.get("message"), str)
    ):
        shown = done.stdout[:300].decode(errors="replace") or "(nothing)"
        raise JudgeError(
            f"{binary} judge exited {done.returncode} with no verdict this plugin can read (a JSON outcome and "
            f"message; is the binary from another leaklab version?): stdout {shown!r}; stderr: {said}"
        )
    return answer


def check(
    fn: Callable[[], object],
    *,
    calls: int = 300,
    warmup: int = 30,
    max_per_call: float | str | None = None,
) -> LeakReport:
    """Calls ``fn`` ``warmup + calls`` times, samples, and asks the judge; fails nothing itself.

    :func:`leak_check` (the fixture) and the marker fail the test on this report; call this to
    look at the figures (``report.series(TENSOR_BYTES)``) or to use the check outside pytest.
    Raises :class:`JudgeError` where ``leaklab judge`` gives no verdict.
    """
    if not callable(fn):
        raise TypeError(f"leak_check needs a function to call, not {fn!r}")
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be a positive number of calls, not {calls!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be zero or more calls, not {warmup!r}")
    budget = _as_bytes(max_per_call)
    clock = time.perf_counter
    seconds: dict[str, float] = {"census": 0.0, "census_calls": 0.0}
    notes: list[str] = []
    started = clock()
    # The collector stays frozen (gc.freeze()) through the check: what existed before is then
    # neither scanned by each collection nor listed by each tally. A young collection first, not
    # a full one (100 ms in a session that imported torch): older garbage is frozen with the
    # rest, where it stays as it was, and is collected as usual once the check thaws it. A
    # process that froze objects itself keeps them so: the check then scans everything, slower
    # but the same.
    frozen = _Freezer(gc.get_freeze_count() == 0)
    try:
        gc.collect(1)
        seconds["collect_first"] = clock() - started
        frozen.freeze()
        for _ in range(warmup):
            _call(fn)
        seconds["warmup"] = clock() - started - seconds["collect_first"]
        t = clock()
        gc.collect()  # the warm-up's garbage: garbage awaiting the collector is not a leak
        seconds["collect_warmup"] = clock() - t
        # Torch is looked for after the warm-up, so that a function that imports it lazily counts.
        torch = _signals.loaded_torch()
        sampler = _Sampler(torch, _signals.cuda_devices(torch) if torch is not None else [], warmup, calls)
        t = clock()
        if frozen.ours and sampler.tallier is not None:
            frozen.thaw()
            sampler.tallier.remember()
            frozen.freeze()
        seconds["remember"] = clock() - t
        for i in range(warmup, warmup + calls):
            t0 = clock()
            _call(fn)
            sampler.sample(i, clock() - t0)
        seconds["calls"] = sampler.fn_seconds
        seconds.update(sampler.spent)
    finally:
        frozen.thaw()
    if torch is None:
        why = "not installed" if importlib.util.find_spec("torch") is None else "not imported by the calls"
        notes.append(f"no tensor signals: torch is {why} in this process; anonymous memory alone was watched")
    if not sampler.anon:
        notes.append("no anonymous memory: /proc/self/status has no RssAnon line on this system")
    elif not sampler.trimmed:
        notes.append("the C library has no malloc_trim: small non-tensor leaks may fill free heap unseen")

    request: dict[str, Any] = {
        "warmup": warmup,
        "calls": calls,
        "max_per_call": budget,
        "unit": "call",
        "series": sampler.series(),
        "census_before": None,
        "census_after": None,
    }
    t = clock()
    answer = _judge(request)
    seconds["judge"] = clock() - t
    if answer["outcome"] == "fail" and torch is not None:
        # Who holds it, asked only of a check that failed: a census, further calls, a census,
        # and the judge again with the holders that grew between them.
        extra = min(calls, CENSUS_CALLS)
        t = clock()
        before, note = _census()
        seconds["census"] += clock() - t
        if before is not None:
            t = clock()
            for _ in range(extra):
                _call(fn)
            seconds["census_calls"] = clock() - t
            t = clock()
            after, note = _census()
            seconds["census"] += clock() - t
        if before is not None and after is not None:
            request.update(census_before=before, census_after=after, census_calls=extra)
            t = clock()
            answer = _judge(request)
            seconds["judge"] += clock() - t
        elif note:
            notes.append(note)
    seconds["total"] = clock() - started
    added = seconds["total"] - seconds["calls"] - seconds["warmup"]
    lines = [answer["message"], *(f"  Note: {n}" for n in notes)]
    census_part = f"censuses {seconds['census']:.2f} s, " if seconds["census"] else ""
    if seconds["census_calls"]:
        census_part += f"{extra} further calls between them {seconds['census_calls']:.2f} s, "
    lines.append(
        f"leak_check: {warmup} + {calls} calls of {_name(fn)} took {seconds['warmup'] + seconds['calls']:.2f} s; "
        f"the check added {added:.2f} s (a first young collection {seconds['collect_first']:.2f} s, "
        f"the tensors from before {seconds['remember']:.2f} s, {census_part}"
        f"samples {seconds['collect'] + seconds['anonymous'] + seconds['cuda'] + seconds['tally']:.2f} s, "
        f"judge {seconds['judge']:.2f} s)"
    )
    return LeakReport(
        outcome=str(answer["outcome"]),
        message="\n".join(lines),
        calls=calls,
        warmup=warmup,
        seconds=seconds,
        answer=answer,
        request=request,
    )


def _keep_evidence(config: pytest.Config | None, nodeid: str, index: int, report: LeakReport) -> LeakReport:
    """Writes a check's evidence (what it sent the judge: ``leaklab judge FILE`` re-judges it)
    into ``--leak-evidence DIR`` for every check, or, without it, into pytest's cache for a
    check that did not pass; the report's message says where. A passing check without the
    option writes nothing."""
    if config is None:
        return report
    folder = config.getoption("leak_evidence", None)
    if folder is None and report.passed:
        return report
    if folder is not None:
        where = Path(folder)
    elif (cache := getattr(config, "cache", None)) is not None:  # absent under -p no:cacheprovider
        where = Path(cache.mkdir("leaklab-evidence"))
    else:
        return report  # -p no:cacheprovider, and no folder asked for
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_") or "check"
    path = where / (f"{name}.json" if index <= 1 else f"{name}-{index}.json")
    try:
        where.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report.request))
    except OSError as e:
        report.message += f"\n  Note: its evidence could not be written to {path}: {e}"
        return report
    report.evidence = str(path)
    report.message += f"\n  evidence: {path} (leaklab judge {path} judges it again)"
    return report


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("leaklab").addoption(
        "--leak-evidence",
        metavar="DIR",
        default=None,
        help="write every leak check's evidence (its series and censuses, which `leaklab judge FILE` "
        "judges again) into DIR; without it, only a failing check's, into pytest's cache",
    )


def _enforce(report: LeakReport) -> LeakReport:
    if report.outcome != "pass":
        pytest.fail(report.message, pytrace=False)
    return report


def _checked(fn: Callable[[], object], **options: Any) -> LeakReport:
    """:func:`check`, where a judge that gave no verdict fails the test with a sentence, not a traceback."""
    try:
        return check(fn, **options)
    except JudgeError as e:
        failure = str(e)
    # Outside the except block: the failure is the sentence, without the judge error chained to it.
    pytest.fail(f"leak_check could not judge {_name(fn)}: {failure}", pytrace=False)


class LeakCheck:
    """The ``leak_check`` fixture's value: call it with the function to check."""

    def __init__(self, config: pytest.Config | None = None, nodeid: str = "") -> None:
        #: Every check this test made, passed or failed, in order (the figures: ``.seconds``,
        #: ``.series(name)``).
        self.reports: list[LeakReport] = []
        self._config, self._nodeid = config, nodeid

    def __call__(
        self,
        fn: Callable[[], object],
        calls: int = 300,
        warmup: int = 30,
        max_per_call: float | str | None = None,
    ) -> LeakReport:
        """Calls ``fn`` ``warmup + calls`` times and fails the test if the memory it leaves grows.

        Without ``max_per_call`` any growth proven within the judged calls fails; with it
        (bytes, or a string such as ``"4 KiB"``), only a growth faster than that per call. A
        cache that fills during the warm-up, or fills and stops, passes. Returns the report.
        """
        report = _checked(fn, calls=calls, warmup=warmup, max_per_call=max_per_call)
        self.reports.append(report)
        return _enforce(_keep_evidence(self._config, self._nodeid, len(self.reports), report))


@pytest.fixture
def leak_check(request: pytest.FixtureRequest) -> LeakCheck:
    """``leak_check(fn, calls=300, warmup=30, max_per_call=None)``: fails the test when ``fn`` leaks."""
    return LeakCheck(request.config, request.node.nodeid)


_MARKER_OPTIONS = ("calls", "warmup", "max_per_call")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "leak_check(calls=300, warmup=30, max_per_call=None): run the test body warmup + calls times "
        "and fail it when the memory it leaves behind grows (leaklab)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Runs a ``@pytest.mark.leak_check`` test's body through the check instead of once.

    The body is called ``warmup + calls`` times with the same fixture values: fixtures are set
    up once, so what they make is state made once, and only what the body leaves behind counts.
    """
    marker = pyfuncitem.get_closest_marker("leak_check")
    if marker is None:
        return None
    if marker.args or set(marker.kwargs) - set(_MARKER_OPTIONS):
        unknown = [*map(repr, marker.args), *sorted(set(marker.kwargs) - set(_MARKER_OPTIONS))]
        pytest.fail(
            f"@pytest.mark.leak_check takes keyword options {', '.join(_MARKER_OPTIONS)}; not {', '.join(unknown)}",
            pytrace=False,
        )
    if "leak_check" in pyfuncitem.fixturenames:
        pytest.fail(
            "this test has both the leak_check marker and the leak_check fixture: the marker would call "
            "the body, and the check in it, hundreds of times; use one of them",
            pytrace=False,
        )
    body = pyfuncitem.obj
    if inspect.iscoroutinefunction(body):
        pytest.fail(
            "@pytest.mark.leak_check runs synchronous test bodies; for a coroutine, use the leak_check "
            "fixture with a wrapper: leak_check(lambda: asyncio.run(handler()))",
            pytrace=False,
        )
    funcargs = pyfuncitem.funcargs
    args = {name: funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}

    def run_body() -> object:
        return body(**args)

    run_body.__qualname__ = f"the body of {pyfuncitem.name}"
    _enforce(_keep_evidence(pyfuncitem.config, pyfuncitem.nodeid, 1, _checked(run_body, **marker.kwargs)))
    return True

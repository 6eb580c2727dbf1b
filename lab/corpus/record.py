"""Record the judge's corpus: every subject (subjects.py) under every regime, scanned by the real
``leaklab scan`` from outside (``--pid``), each recording kept with its ground truth.

    python lab/corpus/record.py --leaklab target/release/leaklab --out lab/corpus/recordings \
        [--regime glibc ...] [--subject bytes-list-2k ...] [--leaky-runs 2] [--passing-runs 4]

``cargo xtask record-corpus`` runs it (after a release build of ``leaklab``). A regime is the
environment the services run in, set before their process starts (an allocator preloaded is
loaded at exec): one server per regime imports torch once and forks each subject's service in
turn, the next once the last is killed. A recording is one gzipped JSON file,
``RECORDINGS/REGIME/SUBJECT/RUN.json.gz``: ``{"regime", "subject", "run", "truth", "scan":
<the scan's evidence.json>}``.

The scan: 50 warm-up and 1,000 judged requests, each a new input (``--vary``), concurrency 1,
no budget; the judge-bench re-judges each recording over its first 300, 600 and 1,000 judged
requests. Under the regimes with the agent (``AGENT_FLAGS``), whose readings come after the
judged requests, the runs take 300, 600 and 1,000 judged requests in turn, each judged at its
own length: three runs for every two asked (``--leaky-runs 2`` gives one of each length).
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import IO, Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import subjects

PR_SET_PDEATHSIG = 1  # <sys/prctl.h>
LIB = "/usr/lib/x86_64-linux-gnu"
# Each regime's environment for the services; "busy" also runs a busy loop beside the scan.
REGIMES: dict[str, dict[str, str]] = {
    "glibc": {},
    "arena1": {"MALLOC_ARENA_MAX": "1"},
    "jemalloc": {"LD_PRELOAD": f"{LIB}/libjemalloc.so.2"},
    "tcmalloc": {"LD_PRELOAD": f"{LIB}/libtcmalloc_minimal.so.4"},
    "busy": {},
    "agent": {},
    "agent-collect": {},
    "workers": {},
}
# Regimes whose services are trees: the process the scan is given (--pid) binds the socket and
# forks this many workers that serve it, as gunicorn's master does (pre-fork); the memory kept
# is the workers', the master's stays flat, and the scan reads the tree.
WORKERS: dict[str, int] = {"workers": 2}
# Regimes whose services mount leaklab's agent, and what the scan asks of it: as the zoo scans
# (its trim probe and Python trace after the judged requests), and with full collections before
# the warm-up and after the judged requests (--collect, the garbage rule's evidence).
AGENT_FLAGS: dict[str, list[str]] = {
    "agent": ["--trim", "--python-trace"],
    "agent-collect": ["--trim", "--collect", "--python-trace"],
}
WARMUP, REQUESTS = 50, 1000
# The agent's readings are taken once, after the judged requests, so a recording that has them
# is judged at its own length only: its runs take these lengths in turn.
AGENT_LENGTHS = (300, 600, 1000)


def serve_each(names: list[str], agent: bool, workers: int) -> None:
    """Imports what every subject imports once, then forks each subject's service in turn, the
    next once the last was killed; each prints ``leaklab-corpus NAME pid PID listening on URL``.
    With ``agent``, each mounts leaklab's agent as the zoo's services do. With ``workers``, the
    service's process forks that many workers that serve its socket and serves nothing itself.
    """
    import socket

    import fastapi  # noqa: F401
    import torch  # noqa: F401
    import uvicorn

    parent = os.getpid()
    for name in names:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setpgid(0, 0)
                ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() == parent:
                    app = subjects.make_app(name)
                    if agent:
                        try:
                            from leaklab.asgi import LeaklabDebug
                        except (
                            ImportError
                        ):  # the wheel not installed: the source tree's
                            sys.path.insert(
                                0, os.path.join(HERE, "../../crates/cli/python")
                            )
                            from leaklab.asgi import LeaklabDebug

                        app.add_middleware(
                            LeaklabDebug, allow_trim=True, python_trace_max_seconds=30.0
                        )
                    # TCP_NODELAY needs the proto named (see lab/zoo/_zoo.py's serve).
                    sock = socket.socket(
                        socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
                    )
                    sock.bind(("127.0.0.1", 0))
                    sock.listen(128)
                    host, port = sock.getsockname()
                    print(
                        f"leaklab-corpus {name} pid {os.getpid()} "
                        f"listening on http://{host}:{port}",
                        flush=True,
                    )
                    config = uvicorn.Config(app, log_level="warning", access_log=False)
                    if workers:
                        serve_forked(config, sock, workers)
                    else:
                        uvicorn.Server(config).run(sockets=[sock])
                    code = 0
            except BaseException:  # noqa: BLE001 (a forked child must not return into the loop)
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if not os.WIFSIGNALED(status):
            raise SystemExit(f"{name} (pid {pid}) ended by itself: see its stderr")


def serve_forked(config: Any, sock: Any, workers: int) -> None:
    """Forks ``workers`` processes that serve ``sock`` with ``config`` and waits on them: the
    scan's whole process group is killed when it is done."""
    import uvicorn

    for _ in range(workers):
        if os.fork() == 0:
            code = 1
            try:
                ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                uvicorn.Server(config).run(sockets=[sock])
                code = 0
            except BaseException:  # noqa: BLE001 (a forked child must not return)
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
    for _ in range(workers):
        os.wait()


def listening(stdout: IO[str], name: str, timeout: float) -> tuple[str, int]:
    """The URL and pid of ``name``'s service, from its line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stdout.readline()
        if not line:
            raise SystemExit(f"the server ended before {name} started")
        if " listening on " in line:
            head, url = line.split(" listening on ")
            words = head.split()
            if words[1] != name:
                raise SystemExit(f"the server said {line!r} where {name} was to start")
            return url.strip(), int(words[3])
    raise SystemExit(f"{name} did not start in {timeout} s")


def record(args: argparse.Namespace) -> int:
    body = os.path.join(tempfile.mkdtemp(prefix="leaklab-corpus-"), "body.json")
    with open(body, "w") as f:
        json.dump(subjects.body(), f)
    failures = 0
    started = time.monotonic()
    for regime in args.regime or list(REGIMES):
        plan: list[tuple[str, int]] = []
        for name in args.subject or subjects.names():
            runs = (
                args.passing_runs if subjects.truth(name).must_pass else args.leaky_runs
            )
            if regime in AGENT_FLAGS:
                # Each length of a recording judged at its own length gets half the runs.
                runs = len(AGENT_LENGTHS) * -(-runs // 2)
            plan.extend((name, run) for run in range(runs))
        env = {**os.environ, **REGIMES[regime]}
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", ",".join(n for n, _ in plan)]
            + (["--serve-agent"] if regime in AGENT_FLAGS else [])
            + ["--serve-workers", str(WORKERS.get(regime, 0))],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            process_group=0,
        )
        assert server.stdout is not None
        try:
            for i, (name, run) in enumerate(plan):
                url, pid = listening(server.stdout, name, 120)
                busy = None
                if regime == "busy":
                    busy = subprocess.Popen(
                        [sys.executable, "-c", "while True: pass"], process_group=0
                    )
                try:
                    ok = scan_one(args, regime, name, run, url, pid, body)
                finally:
                    if busy is not None:
                        os.killpg(busy.pid, signal.SIGKILL)
                        busy.wait()
                    os.killpg(pid, signal.SIGKILL)
                failures += not ok
                print(
                    f"leaklab: [{regime} {i + 1}/{len(plan)}] {name} run {run}: "
                    f"{'recorded' if ok else 'FAILED'} "
                    f"({time.monotonic() - started:.0f} s so far)",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    return 1 if failures else 0


def scan_one(
    args: argparse.Namespace,
    regime: str,
    name: str,
    run: int,
    url: str,
    pid: int,
    body: str,
) -> bool:
    """One scan of a subject's service, its evidence kept with its truth."""
    requests = REQUESTS
    agent = AGENT_FLAGS.get(regime)
    if agent is not None:
        requests = AGENT_LENGTHS[run % len(AGENT_LENGTHS)]
    with tempfile.TemporaryDirectory(prefix="leaklab-corpus-scan-") as out:
        command = [
            args.leaklab,
            "scan",
            f"{url}/predict",
            "--body",
            body,
            "--vary",
            "--pid",
            str(pid),
            "--warmup",
            str(WARMUP),
            "--requests",
            str(requests),
            "--time-limit",
            "5m",
            "--json",
            "--out",
            out,
        ]
        if agent is not None:
            command += ["--agent", f"{url}/debug/leaklab", *agent]
        done = subprocess.run(command, check=False, capture_output=True, text=True)
        evidence = os.path.join(out, "evidence.json")
        if not os.path.exists(evidence):
            print(done.stderr[-2000:], file=sys.stderr)
            return False
        with open(evidence) as f:
            scan: Any = json.load(f)
    doc = {
        "regime": regime,
        "subject": name,
        "run": run,
        "truth": subjects.truth_json(name, WORKERS.get(regime, 0)),
        "scan": scan,
    }
    folder = os.path.join(args.out, regime, name)
    os.makedirs(folder, exist_ok=True)
    write(os.path.join(folder, f"{run}.json.gz"), doc)
    return True


def retruth(folder: str) -> int:
    """Rewrites every recording's truth under ``folder`` as :func:`subjects.truth` states it
    now: a truth comes from how its subject was built, never from a run, so a truth stated more
    exactly (a new field, an axis named) applies to the recordings already made."""
    changed = 0
    for root, _, files in os.walk(folder):
        for name in sorted(files):
            if not name.endswith(".json.gz"):
                continue
            path = os.path.join(root, name)
            with gzip.open(path) as f:
                doc = json.load(f)
            truth = subjects.truth_json(doc["subject"], WORKERS.get(doc["regime"], 0))
            if doc["truth"] != truth:
                doc["truth"] = truth
                write(path, doc)
                changed += 1
    print(f"leaklab: {changed} recordings' truth rewritten", file=sys.stderr)
    return 0


def write(path: str, doc: dict[str, Any]) -> None:
    """One recording, gzipped; mtime 0: the same recording packs to the same bytes."""
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as packed,
    ):
        packed.write(json.dumps(doc, sort_keys=True).encode())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serve", metavar="NAME,NAME", help=argparse.SUPPRESS)
    parser.add_argument("--serve-agent", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-workers", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--leaklab", default="target/release/leaklab")
    parser.add_argument("--out", default=os.path.join(HERE, "recordings"))
    parser.add_argument("--regime", action="append", choices=list(REGIMES))
    parser.add_argument(
        "--subject", action="append", choices=subjects.names() + list(subjects.HELD_OUT)
    )
    parser.add_argument("--leaky-runs", type=int, default=2)
    parser.add_argument("--passing-runs", type=int, default=4)
    parser.add_argument(
        "--retruth",
        action="store_true",
        help="rewrite the recordings' truth under --out from subjects.py, record nothing",
    )
    args = parser.parse_args()
    if args.retruth:
        sys.exit(retruth(args.out))
    if args.serve:
        serve_each(args.serve.split(","), args.serve_agent, args.serve_workers)
        return
    for regime, env in REGIMES.items():
        lib = env.get("LD_PRELOAD")
        if lib and not os.path.exists(lib) and regime in (args.regime or REGIMES):
            raise SystemExit(
                f"{lib} is missing (regime {regime}): apt-get install libjemalloc2 "
                "libtcmalloc-minimal4"
            )
    sys.exit(record(args))


if __name__ == "__main__":
    main()

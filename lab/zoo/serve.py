"""Serve one cause of the zoo, list them all, or write an entry's request bodies.

    python lab/zoo/serve.py CAUSE --variant leaky|fixed [--port 0] [--native-seconds S]
    python lab/zoo/serve.py CAUSE --variants leaky,fixed     # each in turn, as the driver does
    python lab/zoo/serve.py --list                   # every ENTRY as JSON, for the driver
    python lab/zoo/serve.py CAUSE --bodies DIR [--count N]   # the bodies the scan sends

The entry's environment knobs for the variant are set before its ``make_app`` runs (and, with
--variant, before its module imports torch). With --variants, this process imports what every
variant imports (``Entry.preload``) once, then forks each variant's service in turn, the next
once the last has been killed (``kill -9 PID``, the pid its line prints): the zoo's driver
scans both variants of a cause for one import of torch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _zoo import VARIANTS, Entry, Variant, agent_middleware, serve, to_json

PR_SET_PDEATHSIG = 1  # <sys/prctl.h>


def causes() -> dict[str, Any]:
    """Every cause module beside this file (not the private ones, nor the tests), by name."""
    names = sorted(
        m.name
        for m in pkgutil.iter_modules([HERE])
        if not m.name.startswith(("_", "test_")) and m.name != "serve"
    )
    return {name: importlib.import_module(name) for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("cause", nargs="?")
    parser.add_argument("--variant", choices=VARIANTS, default="leaky")
    parser.add_argument(
        "--variants",
        metavar="V,V",
        type=lambda text: text.split(","),
        help="serve these variants in turn, each forked from this process (a random port)",
    )
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--bodies", metavar="DIR")
    parser.add_argument("--count", type=int)
    # The agent's native trace (memray), off unless asked: the longest window it may trace.
    parser.add_argument("--native-seconds", type=float, default=0.0)
    args = parser.parse_args()
    if args.list:
        print(to_json([m.ENTRY.describe() for m in causes().values()]))
        return
    if not args.cause:
        parser.error("name a cause (see --list)")
    module = causes().get(args.cause)
    if module is None:
        parser.error(f"no cause {args.cause!r} in the zoo; --list names them")
    entry: Entry = module.ENTRY
    if args.bodies:
        write_bodies(entry, args.bodies, args.count)
        return
    if args.variants:
        unknown = [v for v in args.variants if v not in VARIANTS]
        if unknown:
            parser.error(
                f"--variants: no variant {unknown}; the variants are {VARIANTS}"
            )
        serve_each(entry, module, args.variants, args.native_seconds)
        return
    os.environ.update(entry.env.get(args.variant, {}))
    serve(
        module.make_app(args.variant),
        f"{entry.name}-{args.variant}",
        args.port,
        native_max_seconds=args.native_seconds,
    )


def serve_each(
    entry: Entry, module: Any, variants: list[Variant], native_seconds: float
) -> None:
    """Each variant's service in turn, forked from this process once it has imported what
    every variant imports. A variant's service leads a process group of its own (its workers
    with it: the driver kills the group) and dies with this process; the next is forked once
    it was killed, and an end of its own (an error) ends the run."""
    import ctypes
    import signal
    import traceback

    for name in ("fastapi", "uvicorn", *entry.preload):
        importlib.import_module(name)
    agent_middleware()
    parent = os.getpid()
    for variant in variants:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setpgid(0, 0)
                ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() == parent:  # else it died before the prctl
                    os.environ.update(entry.env.get(variant, {}))
                    serve(
                        module.make_app(variant),
                        f"{entry.name}-{variant}",
                        native_max_seconds=native_seconds,
                    )
                    code = 0
            except BaseException:  # noqa: BLE001 (a forked child must not return into this loop)
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if not os.WIFSIGNALED(status):
            raise SystemExit(
                f"{entry.name}-{variant} (pid {pid}) ended by itself, "
                f"exit status {os.waitstatus_to_exitcode(status)}: see its stderr above"
            )


def write_bodies(entry: Entry, folder: str, count: int | None) -> None:
    """One file per request for "shapes" (request i's body), else one file."""
    if entry.body is None:
        raise SystemExit(f"{entry.name} declares no body")
    os.makedirs(folder, exist_ok=True)
    # Beyond the judged requests, the scan sends more (the repeat phase resends inputs already
    # seen; the looks inside and the agent's trace windows send new ones, as traffic would):
    # enough bodies that those stay new.
    n = (
        (count or entry.warmup + 2 * entry.requests + 250)
        if entry.inputs == "shapes"
        else 1
    )
    for i in range(n):
        with open(os.path.join(folder, f"{i:06d}.json"), "w") as f:
            json.dump(entry.body(i), f)


if __name__ == "__main__":
    main()

"""Serve one cause of the zoo, list them all, or write an entry's request bodies.

    python lab/zoo/serve.py CAUSE --variant leaky|fixed [--port 0] [--native-seconds S]
    python lab/zoo/serve.py --list                   # every ENTRY as JSON, for the driver
    python lab/zoo/serve.py CAUSE --bodies DIR [--count N]   # the bodies the scan sends

The entry's environment knobs for the variant are set before its module imports torch.
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

from _zoo import VARIANTS, Entry, serve, to_json


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
    os.environ.update(entry.env.get(args.variant, {}))
    serve(
        module.make_app(args.variant),
        f"{entry.name}-{args.variant}",
        args.port,
        native_max_seconds=args.native_seconds,
    )


def write_bodies(entry: Entry, folder: str, count: int | None) -> None:
    """One file per request for "shapes" (request i's body), else one file."""
    if entry.body is None:
        raise SystemExit(f"{entry.name} declares no body")
    os.makedirs(folder, exist_ok=True)
    n = (count or entry.warmup + entry.requests) if entry.inputs == "shapes" else 1
    for i in range(n):
        with open(os.path.join(folder, f"{i:06d}.json"), "w") as f:
            json.dump(entry.body(i), f)


if __name__ == "__main__":
    main()

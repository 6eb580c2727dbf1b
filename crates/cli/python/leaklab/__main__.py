"""``python -m leaklab ...``: the same as ``leaklab ...``, for environments without scripts on PATH."""

from __future__ import annotations

import os
import sys

from leaklab._find_bin import LeaklabNotFound, find_leaklab_bin


def _run() -> None:
    try:
        binary = find_leaklab_bin()
    except LeaklabNotFound as e:
        print(f"leaklab: {e}", file=sys.stderr)
        sys.exit(2)
    args = [binary, *sys.argv[1:]]
    if sys.platform == "win32":  # pragma: no cover - leaklab ships for Linux only
        import subprocess

        sys.exit(subprocess.call(args))
    os.execvp(binary, args)


if __name__ == "__main__":
    _run()

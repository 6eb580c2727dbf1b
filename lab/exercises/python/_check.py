"""The Python exercises' side of ``cargo xtask lab check 5|6``: serve a copy, write the scan's
bodies, verify the answers.

    python lab/exercises/python/_check.py serve N FILE       # prints "... listening on http://..."
    python lab/exercises/python/_check.py bodies N DIR COUNT # request i's body in DIR/i.json
    python lab/exercises/python/_check.py truths N FILE COUNT # the true answers, as JSON in FILE
    python lab/exercises/python/_check.py verify N URL COUNT [TRUTHS] # JSON: checked, wrong ones

``serve`` loads FILE (the learner's copy, the original or the solution) by path and serves its
``make_app()`` as the zoo does (lab/zoo/_zoo.py: loopback, leaklab's agent mounted). ``verify``
sends bodies the scan never sent and compares every answer with ``_contract.truth``, or with the
answers ``truths`` wrote from it (which spares torch's import, 2 s of CPU, in each check).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import urllib.error
import urllib.request
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "zoo"))

import _contract

# The verified bodies start far past the scan's, so every one is an input it never saw.
VERIFY_FROM = 3000
# f32 rounding, and kernels that differ by shape: what a right answer may differ by.
RTOL = ATOL = 1e-4


def serve(exercise: int, path: str) -> None:
    spec = importlib.util.spec_from_file_location(f"ex{exercise}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from _zoo import serve as zoo_serve

    zoo_serve(module.make_app(), f"exercise {exercise}", 0)


def bodies(exercise: int, folder: str, count: int) -> None:
    os.makedirs(folder, exist_ok=True)
    for i in range(count):
        with open(os.path.join(folder, f"{i:06d}.json"), "w") as f:
            json.dump(_contract.body(exercise, i), f)


def answer_of(exercise: int, reply: Any) -> list[float]:
    """The figures of a reply, flattened; TypeError or ValueError if the reply has none where they belong."""
    if not isinstance(reply, dict):
        raise TypeError(f"the reply is not a JSON object: {str(reply)[:80]}")
    if exercise == 5:
        got = reply.get("features")
        if not isinstance(got, list):
            raise ValueError('the reply has no "features" list')
        return [float(v) for v in got]
    got = reply.get("outputs")
    if not isinstance(got, list) or not all(isinstance(row, list) for row in got):
        raise ValueError('the reply has no "outputs" rows')
    mean_norm = reply.get("mean_norm")
    if not isinstance(mean_norm, (int, float)) or not math.isfinite(mean_norm):
        raise ValueError(
            f'"mean_norm" is {mean_norm!r}, not a finite number: keep it working'
        )
    return [float(v) for row in got for v in row]


def compare(got: list[float], want: list[float]) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} figures, expected {len(want)}"
    for j, (a, b) in enumerate(zip(got, want)):
        if not abs(a - b) <= ATOL + RTOL * abs(b):
            return f"figure {j} is {a:.6g}, expected {b:.6g}"
    return None


def model_of(exercise: int) -> Any:
    return _contract.shapes_net() if exercise == 5 else _contract.mlp()


def truths(exercise: int, path: str, count: int) -> None:
    """The true answers for ``verify``'s bodies, written whole (checks may run side by side)."""
    model = model_of(exercise)
    answers = [
        _contract.truth(exercise, _contract.body(exercise, i), model)
        for i in range(VERIFY_FROM, VERIFY_FROM + count)
    ]
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as f:
        json.dump(answers, f)
    os.replace(partial, path)


def verify(exercise: int, url: str, count: int, truths_path: str | None) -> None:
    if truths_path is None:
        model = model_of(exercise)
        want = [
            _contract.truth(exercise, _contract.body(exercise, i), model)
            for i in range(VERIFY_FROM, VERIFY_FROM + count)
        ]
    else:
        with open(truths_path) as f:
            want = json.load(f)
        if len(want) != count:
            raise SystemExit(f"{truths_path} has {len(want)} answers, not {count}")
    wrong: list[str] = []
    for i in range(VERIFY_FROM, VERIFY_FROM + count):
        b = _contract.body(exercise, i)
        request = urllib.request.Request(
            url, json.dumps(b).encode(), {"content-type": "application/json"}
        )
        what = f"request {i - VERIFY_FROM}" + (
            f" ({b['h']}x{b['w']})" if exercise == 5 else ""
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                reply = json.load(r)
            problem = compare(answer_of(exercise, reply), want[i - VERIFY_FROM])
        except (urllib.error.URLError, OSError, TypeError, ValueError) as e:
            problem = str(e)
        if problem is not None:
            wrong.append(f"{what}: {problem}")
    print(json.dumps({"checked": count, "wrong": wrong}))


def main() -> None:
    usage = __doc__ or ""
    args = sys.argv[1:]
    if (
        len(args) < 3
        or args[0] not in ("serve", "bodies", "truths", "verify")
        or args[1] not in ("5", "6")
    ):
        raise SystemExit(usage)
    exercise = int(args[1])
    if args[0] == "serve":
        serve(exercise, args[2])
    elif args[0] == "verify" and len(args) in (4, 5):
        verify(exercise, args[2], int(args[3]), args[4] if len(args) == 5 else None)
    elif len(args) != 4:
        raise SystemExit(usage)
    elif args[0] == "bodies":
        bodies(exercise, args[2], int(args[3]))
    elif args[0] == "truths":
        truths(exercise, args[2], int(args[3]))
    else:
        raise SystemExit(usage)


if __name__ == "__main__":
    main()

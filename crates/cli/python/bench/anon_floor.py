"""The anonymous-memory rule, measured: which noise floor keeps clean cases passing and what it still catches.

    python crates/cli/python/bench/anon_floor.py --processes 3

Runs every case of compare_memray.py through ``leaklab.pytest_plugin.check`` (defaults: 30
warm-up calls, 300 judged) in ``--processes`` fresh Python processes, keeps each run's anonymous
memory series, and judges the series again with ``leaklab judge`` at several noise floors. A
clean case failed at a floor is a false alarm that floor would have raised; a leak passed is one
it would have missed. The plugin's floor is the judge's host noise floor (64 KiB).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLOORS = [4096, 16384, 32768, 65536, 131072, 262144]

RECORD = """
import json, sys
sys.path.insert(0, {folder!r})
import cases
from leaklab.pytest_plugin import ANONYMOUS, check

out = []
for name in {names!r}:
    report = check(cases.make(name))
    anon = next(s for s in report.request["series"] if s["name"] == ANONYMOUS)
    out.append({{"name": name, "samples": anon["samples"], "outcome": report.outcome}})
json.dump(out, sys.stdout)
"""


def judge(binary: str, samples: list[list[int]], floor: int) -> dict[str, object]:
    request = {
        "warmup": 30,
        "calls": 300,
        "series": [{"name": "anonymous memory", "kind": "noisy", "samples": samples, "noise_floor": floor}],
    }
    done = subprocess.run([binary, "judge", "-", "--json"], input=json.dumps(request).encode(), capture_output=True)
    series: dict[str, object] = json.loads(done.stdout)["series"][0]
    return series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from compare_memray import CASES, CASES_MODULE, _package_root
    from leaklab import find_leaklab_bin

    binary = find_leaklab_bin()
    names = [c[0] for c in CASES]
    leaks = {c[0]: c[1] for c in CASES}
    runs: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="leaklab-floor-") as tmp:
        (Path(tmp) / "cases.py").write_text(CASES_MODULE)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([_package_root(), os.environ.get("PYTHONPATH", "")])}
        for p in range(args.processes):
            done = subprocess.run(
                [sys.executable, "-W", "ignore", "-c", RECORD.format(folder=tmp, names=names)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            runs.extend(json.loads(done.stdout))
            print(f"process {p + 1}: recorded {len(names)} cases", file=sys.stderr)
    print(f"{len(runs)} runs ({args.processes} processes x {len(names)} cases), 300 judged calls each.\n")
    print("| floor | clean runs failed | leak runs caught | slope bounds of clean runs (low, kB per call) |")
    print("|---|---|---|---|")
    for floor in FLOORS:
        false_alarms, caught, clean, leaking, lows = 0, [], 0, 0, []
        for run in runs:
            s = judge(binary, run["samples"], floor)  # type: ignore[arg-type]
            slope = s["slope"] or {"low": 0.0}
            if leaks[str(run["name"])]:
                leaking += 1
                if s["fails"]:
                    caught.append(str(run["name"]))
            else:
                clean += 1
                false_alarms += bool(s["fails"])
                lows.append(slope["low"] / 1000)  # type: ignore[index]
        per_case = {n: caught.count(n) for n in names if leaks[n]}
        missed = [f"{n} {k}/{args.processes}" for n, k in per_case.items() if k < args.processes]
        print(
            f"| {floor // 1024} KiB | {false_alarms}/{clean} | {len(caught)}/{leaking} "
            f"(not always: {', '.join(missed) or 'none'}) | max {max(lows):.2f} |"
        )


if __name__ == "__main__":
    main()

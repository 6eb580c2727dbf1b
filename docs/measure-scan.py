"""Measures `leaklab scan` on both services (the Rust service and its Python twin) for docs/scan.md.

1. Sensitivity: refs-leaky keeps one output per request, so a body of R rows is a real leak of
   R x 512 x 4 bytes per request (2, 4, 8, 16 kB for 1, 2, 4, 8 rows) on top of the service's
   own noise. Each is scanned for 200, 500 and 1,000 judged requests; a cell says what each
   signal called it.
2. False alarms: every fixed variant scanned REPEATS times (600 judged requests), with the
   default budget (a week at one request every 32 s, against the machine's memory) and with a
   tight one (8 GiB, 5 requests/s, 2 days).
3. The Rust service by PID against its own exact allocator, per leaky variant.

Usage, after `cargo build --release -p leaklab -p leaklab-service`, with the torch venv's python
(`cargo xtask env` prints it):  python docs/measure-scan.py OUT_DIR [REPEATS]
It prints the markdown tables; the raw reports stay in OUT_DIR.
"""

import json
import os
import random
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release")
OUT = sys.argv[1]
REPEATS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
CGROUP_PARENT = "/sys/fs/cgroup/memory"
os.makedirs(OUT, exist_ok=True)
WEIGHTS = os.path.join(OUT, "w.safetensors")
subprocess.run([os.path.join(BIN, "leaklab-service"), "export-weights", "--out", WEIGHTS], check=True)


def body(rows):
    path = os.path.join(OUT, f"body-{rows}.json")
    rng = random.Random(rows)
    json.dump({"inputs": [[rng.uniform(-1, 1) for _ in range(512)] for _ in range(rows)]}, open(path, "w"))
    return path


def start(side, variant):
    if side == "rust":
        cmd = [os.path.join(BIN, "leaklab-service"), "serve", "--variant", variant, "--port", "0", "--threads", "1", "--debug-endpoints"]
    else:
        cmd = [sys.executable, os.path.join(ROOT, "lab/python/twin_service.py"), "--variant", variant, "--weights", WEIGHTS, "--port", "0", "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    url = line.split("listening on ")[1].strip()
    return proc, url


def own_rss_series(side):
    return 'leaklab_memory_bytes{probe="rss"}' if side == "rust" else "process_resident_memory_bytes"


def scan(side, variant, rows, requests, name, extra=()):
    proc, url = start(side, variant)
    cgroup = os.path.join(CGROUP_PARENT, f"leaklab-measure-{os.getpid()}")
    flags = []
    try:
        os.makedirs(cgroup, exist_ok=True)
        open(os.path.join(cgroup, "cgroup.procs"), "w").write(str(proc.pid))
        flags = ["--cgroup", cgroup]
    except OSError:
        pass
    cmd = [os.path.join(BIN, "leaklab"), "scan", url + "/v1/infer", "--body", body(rows), "--header", "content-type: application/json",
           "--vary", "--pid", str(proc.pid), *flags, "--metrics", url + "/metrics", "--series", own_rss_series(side),
           "--warmup", "50", "--requests", str(requests), "--json", "--out", os.path.join(OUT, name), *extra]
    started = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True)
    report = json.loads(done.stdout) if done.stdout.strip() else {"outcome": f"no report: {done.stderr.strip()}", "series": []}
    report["exit"] = done.returncode
    report["wall_s"] = time.time() - started
    if side == "rust" and variant.endswith("leaky"):
        samples = json.load(urllib.request.urlopen(url + "/debug/memory/samples?since=50"))
        a, b = samples[0], samples[-1]
        report["exact_bytes_per_request"] = (b["memory"]["cpu"]["live_bytes"] - a["memory"]["cpu"]["live_bytes"]) / (b["request"] - a["request"])
    proc.kill()
    proc.wait()
    time.sleep(0.2)
    try:
        os.rmdir(cgroup)
    except OSError:
        pass
    json.dump(report, open(os.path.join(OUT, name + ".json"), "w"))
    return report


def judged(report, kind):
    for s in report["series"]:
        if kind == "own RSS gauge" and s["series"] not in ("anonymous", "rss", "cgroup_working_set", "cgroup_usage"):
            return s
        if s["series"] == kind:
            return s
    return None


SIGNALS = ["anonymous", "rss", "cgroup_working_set", "own RSS gauge"]

print("## Sensitivity: what each signal called a real leak of R rows x 2 kB per request (refs-leaky)\n")
print("| service | leak per request | judged requests | " + " | ".join(SIGNALS) + " |")
print("|---|---|---|" + "---|" * len(SIGNALS))
for side in ("rust", "twin"):
    for rows in (1, 2, 4, 8):
        for n in (200, 500, 1000):
            r = scan(side, "refs-leaky", rows, n, f"sens-{side}-{rows}-{n}")
            cells = []
            for sig in SIGNALS:
                s = judged(r, sig)
                j = s and s.get("judgement")
                cells.append(f"{j['verdict']} {j['slope']['bytes_per_request'] / 1e3:.1f} kB (noise {j['noise_bytes'] / 1e3:.0f} kB)" if j else "-")
            print(f"| {side} | {rows * 2048 / 1e3:.1f} kB | {n} | " + " | ".join(cells) + " |", flush=True)

print("\n## False alarms: fixed variants, 600 judged requests each\n")
print("| service | budget | scans | exit other than 0 (pass) | series judged `leak` (slow harmless growth that passed on its time to OOM) |")
print("|---|---|---|---|---|")
for side in ("rust", "twin"):
    for budget, extra in (("default (7 days at 1/32 s, machine memory)", ()), ("tight (8 GiB, 5 req/s, 2 days)", ("--capacity", "8GiB", "--rate", "5", "--fail-if-oom-within", "2d"))):
        scans, bad, leaks, series = 0, [], 0, 0
        for rep in range(REPEATS):
            for variant in ("graph-fixed", "refs-fixed", "cache-fixed", "baseline"):
                r = scan(side, variant, 8, 600, f"fa-{side}-{'tight' if extra else 'default'}-{variant}-{rep}", extra)
                scans += 1
                if r["exit"] != 0:
                    bad.append(f"{variant}: exit {r['exit']}")
                for s in r["series"]:
                    if s.get("judgement"):
                        series += 1
                        leaks += s["judgement"]["verdict"] == "leak"
        print(f"| {side} | {budget} | {scans} | {len(bad)} {'; '.join(bad)} | {leaks} of {series} |", flush=True)

print("\n## The Rust service from outside against its own exact allocator (8 rows, 1,000 judged requests)\n")
print("| variant | exact allocator | anonymous (by PID) | ratio | RSS | ratio |")
print("|---|---|---|---|---|---|")
for variant in ("graph-leaky", "refs-leaky", "cache-leaky"):
    r = scan("rust", variant, 8, 1000, f"ratio-{variant}")
    exact = r["exact_bytes_per_request"]
    a = judged(r, "anonymous")["judgement"]["slope"]["bytes_per_request"]
    s = judged(r, "rss")["judgement"]["slope"]["bytes_per_request"]
    print(f"| {variant} | {exact / 1e3:.2f} kB | {a / 1e3:.2f} kB | {a / exact:.2f} | {s / 1e3:.2f} kB | {s / exact:.2f} |", flush=True)

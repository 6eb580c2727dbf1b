"""Tried and not reproduced: an LSTM run from a thread pool (pytorch/pytorch#41486).

    python lab/zoo/tried/lstm_threadpool_openmp.py 0   # torch's default threads
    python lab/zoo/tried/lstm_threadpool_openmp.py 1   # the report's fix, one thread

The zoo entry's service without the service: 3,001 rounds of 4 LSTM calls side by side on a
pool of 4 threads, RssAnon and the OS threads printed every 500 (OMP_NUM_THREADS=4 and an
argument of 4 for more OpenMP threads). docs/zoo.md (tried and not reproduced) has what it
printed; the service itself is in git at 9321913 (lab/zoo/lstm_threadpool_openmp.py).
"""

import sys
from concurrent.futures import ThreadPoolExecutor

import torch


def status(key: str) -> str:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return line.split()[1]
    return "?"


def main(threads: int) -> None:
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(32, 64, batch_first=True).eval()
    pool = ThreadPoolExecutor(4)

    def run(seed: int) -> float:
        x = torch.randn(1, 50, 32, generator=torch.Generator().manual_seed(seed))
        with torch.inference_mode():
            out, _ = lstm(x)
        return float(out[0, -1].norm())

    print("torch threads", torch.get_num_threads())
    for i in range(3001):
        list(pool.map(run, range(4)))
        if i % 500 == 0:
            anon_mb = int(status("RssAnon:")) // 1024
            print(i, anon_mb, "MB anon, threads", status("Threads:"), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))

"""Tried: memory that grows with every call of a compiled function (pytorch/pytorch#174468).

    python lab/zoo/tried/torch_compile_call.py 100000          # the report's x + 1, compiled
    python lab/zoo/tried/torch_compile_call.py 100000 eager    # the same calls, not compiled

The report's loop on CPU (its reproduction used CUDA and bfloat16; CPU keeps the compiled call
and drops the device): ``torch.compile`` of ``x + 1``, called with a new (9, 3840) bfloat16
tensor each time, after a warm-up of 1,000 calls (the compile); prints traced memory
(tracemalloc from the first measured call, as the report measured) and RssAnon every N/10
calls, and after a final ``gc.collect()``. docs/zoo.md (tried and not reproduced) has what it
printed.
"""

import gc
import sys
import tracemalloc

import torch


def anon_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return -1


def forward_static(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def main(n: int, eager: bool) -> None:
    torch.set_num_threads(1)
    call = forward_static if eager else torch.compile(forward_static)
    for _ in range(1000):  # warm-up: the compile, the first calls
        call(torch.randn(9, 3840, dtype=torch.bfloat16))
    gc.collect()
    tracemalloc.start(1)
    base_traced, base_anon = tracemalloc.get_traced_memory()[0], anon_kb()
    print(
        f"{'eager' if eager else 'compiled'}: {n} calls after 1,000; traced and RssAnon from here"
    )
    for i in range(1, n + 1):
        call(torch.randn(9, 3840, dtype=torch.bfloat16))
        if i % (n // 10) == 0:
            traced = tracemalloc.get_traced_memory()[0] - base_traced
            print(
                f"  {i:>8,} calls: traced {traced / 1024:+9.1f} kB, RssAnon {anon_kb() - base_anon:+8,} kB"
            )
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - base_traced
    print(
        f"  after gc.collect(): traced {traced / 1024:+9.1f} kB, RssAnon {anon_kb() - base_anon:+8,} kB"
    )


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 100_000,
        len(sys.argv) > 2 and sys.argv[2] == "eager",
    )

"""Tried and not reproduced: fire-and-forget asyncio tasks (PrefectHQ/fastmcp PR #1343, #1349).

    python lab/zoo/tried/fire_and_forget_tasks.py 100000 forget   # the PR's pattern
    python lab/zoo/tried/fire_and_forget_tasks.py 100000 keep     # the PR's fix

Makes N tasks of ``await asyncio.sleep(0)`` with ``create_task`` and drops them (or keeps each
in a set until done), the loop let run every 1,000, after a warm-up of 1,000; prints the tasks
alive, traced memory (tracemalloc from the first task) and RssAnon before and after.
docs/zoo.md (tried and not reproduced) has what it printed.
"""

import asyncio
import gc
import sys
import tracemalloc


def anon_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return -1


async def flush() -> None:
    await asyncio.sleep(0)


async def main(n: int, keep: bool) -> None:
    kept: set[asyncio.Task[None]] = set()
    for _ in range(1000):  # warm-up
        asyncio.create_task(flush())
    await asyncio.sleep(0.05)
    gc.collect()
    tracemalloc.start(1)
    base_traced, base_anon = tracemalloc.get_traced_memory()[0], anon_kb()
    base_tasks = len(asyncio.all_tasks())
    for i in range(n):
        task = asyncio.create_task(flush())  # fire and forget, as the PR's code
        if keep:
            kept.add(task)  # the PR's fix: a reference until done
            task.add_done_callback(kept.discard)
        if i % 1000 == 999:
            await asyncio.sleep(0)
    await asyncio.sleep(0.1)
    before_gc = tracemalloc.get_traced_memory()[0] - base_traced
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - base_traced
    print(
        f"{'fix' if keep else 'fire-and-forget'}: {n} tasks; all_tasks {base_tasks} -> "
        f"{len(asyncio.all_tasks())}; traced +{before_gc} B before gc.collect, +{traced} B after "
        f"({traced / n:.2f} B a task); RssAnon +{anon_kb() - base_anon} kB"
    )
    tracemalloc.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2] == "keep"))

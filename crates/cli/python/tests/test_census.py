"""The census as a function: storages counted once, bounds that say why they stopped, no trace of itself."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from typing import Any

import pytest
import torch
from leaklab.census import CensusError, census, census_diff

KEEP: dict[str, Any] = {}


def _holder(doc: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((h for h in doc["holders"] if h["holder"] == name), None)


@pytest.fixture
def keep() -> Any:
    yield KEEP
    KEEP.clear()


def test_a_view_shares_its_base_storage_and_is_counted_once(keep: Any) -> None:
    base = torch.zeros(1000)
    keep["bases"] = [base]
    keep["views"] = [base[10:20], base.view(10, 100)]
    del base
    doc = census()
    # Both lists are items of one plain dict, whose keys are variable parts: one holder, the
    # dict, with the base's 4,000 bytes once and three tensors.
    bases = _holder(doc, f"{__name__}.KEEP")
    assert bases is not None
    assert bases["bytes"] == 4000 and bases["tensors"] == 3
    assert sorted(bases["shapes"]) == [[10], [10, 100], [1000]]


def test_a_view_held_elsewhere_adds_no_bytes(keep: Any) -> None:
    global VIEWS
    base = torch.zeros(500)
    keep["base"] = base
    VIEWS = [base[:5]]
    del base  # a local of this test would be a holder too (a frame's)
    try:
        doc = census()
        assert _holder(doc, f"{__name__}.KEEP.base") is None  # a plain dict: its keys are variable
        held = _holder(doc, f"{__name__}.KEEP")
        views = _holder(doc, f"{__name__}.VIEWS")
        assert held is not None and views is not None
        assert (held["bytes"], views["bytes"]) in ((2000, 0), (0, 2000))
        assert held["tensors"] == views["tensors"] == 1
    finally:
        del VIEWS


def test_max_depth_stops_the_walk_and_says_so(keep: Any) -> None:
    keep["deep"] = [[[[torch.zeros(3)]]]]
    full = census()
    assert _holder(full, f"{__name__}.KEEP")["shapes"] == [[3]]  # type: ignore[index]
    doc = census(max_depth=2)
    assert not doc["complete"]
    assert doc["stopped_early"] is not None and doc["stopped_early"].startswith("max_depth")
    # What was not reached is still counted, under a holder that says why it has no name.
    assert _holder(doc, f"{__name__}.KEEP") is None
    unnamed = _holder(doc, "(not reached: the census stopped early)")
    assert unnamed is not None and unnamed["kind"] == "not reached" and [3] in unnamed["shapes"]


def test_max_seconds_stops_the_walk_and_keeps_what_it_found() -> None:
    doc = census(max_seconds=1e-9)
    assert not doc["complete"]
    assert doc["stopped_early"] is not None and doc["stopped_early"].startswith("max_seconds")
    assert doc["visited"] < doc["objects"]


def test_a_census_leaves_nothing_the_next_one_sees(keep: Any) -> None:
    # A graph whose saved tensors the census unpacks (PyTorch then keeps their Python objects
    # from C++), a cycle, a view: two censuses in a row must agree on every holder.
    w = torch.randn(8, 8, requires_grad=True)
    keep["loss"] = (torch.randn(4, 8) @ w).relu().sum()
    keep["views"] = [w.detach()[:2]]
    first, second = census(), census()
    strip = [(h["holder"], h["tensors"], h["bytes"], h["graph"]) for h in first["holders"]]
    assert strip == [(h["holder"], h["tensors"], h["bytes"], h["graph"]) for h in second["holders"]]
    assert census_diff(first, second)["grown"] == []


def test_a_holder_reached_by_a_shorter_path_later_is_still_itself() -> None:
    # The zoo's forward_hook entry (docs/zoo.md): hooks registered per request, each closure
    # keeping a tensor, found through the model in the first census and, in the second, by a
    # shorter path that appeared meanwhile (there, a connection's scope reaching the route's
    # closure). Named by their path, the hooks looked new: 90.11 kB a request for 16.38.
    svc = types.ModuleType("hook_service")
    exec(
        textwrap.dedent(
            """
            import torch
            MODEL = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))

            def perturbation_hook(noise):
                def hook(module, args, output):
                    return output + noise if False else None
                return hook

            def request():
                MODEL[2].register_forward_hook(perturbation_hook(torch.zeros(4096)))  # LEAK(hook)
            """
        ),
        svc.__dict__,
    )
    sys.modules[svc.__name__] = svc
    try:
        for _ in range(10):
            svc.request()
        before = census()
        svc.SHORTCUT = svc.MODEL[2]._forward_hooks  # a path two steps shorter than MODEL's
        for _ in range(30):
            svc.request()
        after = census()
    finally:
        del sys.modules[svc.__name__]
    cell = " → perturbation_hook.<locals>.hook → cell 'noise'"
    first, second = (
        _holder(before, f"hook_service.MODEL.2._forward_hooks[…]{cell}"),
        _holder(after, f"hook_service.SHORTCUT[…]{cell}"),
    )
    assert first is not None and second is not None, "the names differ"
    assert (first["tensors"], second["tensors"]) == (10, 40)
    assert first["identity"] is not None and first["identity"] == second["identity"] == id(svc.MODEL[2]._forward_hooks)
    d = census_diff(before, after, steps=30)
    hooks = [g for g in d["grown"] if g["holder"].startswith("hook_service.")]
    assert [(g["holder"], g["tensors"], g["bytes"], g["bytes_per_step"]) for g in hooks] == [
        (f"hook_service.SHORTCUT[…]{cell}", 30, 30 * 16384, 16384.0)
    ], "30 hooks of 16,384 B in 30 calls, not 40"
    assert any("reached by another path" in n for n in d["notes"]), d["notes"]


def test_the_diff_refuses_what_is_not_a_census_with_the_binary_s_sentence() -> None:
    doc = census(top=1)
    with pytest.raises(
        CensusError, match=r"census-diff exited 2: .*after\.json: not a census: the JSON has no `schema`"
    ):
        census_diff(doc, {"holders": []}, steps=3)  # type: ignore[typeddict-item]
    with pytest.raises(ValueError, match="at least 1"):
        census_diff(doc, doc, steps=0)


def test_a_graph_freed_by_backward_is_still_walked() -> None:
    global LOSS
    w = torch.randn(8, 8, requires_grad=True)
    LOSS = (torch.randn(4, 8) @ w).relu().sum()
    try:
        before = _holder(census(), f"{__name__}.LOSS")
        LOSS.backward()  # frees the saved tensors: reading them raises, the census goes on
        after = _holder(census(), f"{__name__}.LOSS")
        assert before is not None and after is not None
        assert before["graph"]["saved_bytes"] > 0 and after["graph"]["saved_bytes"] == 0
        assert after["graph"]["nodes"] == before["graph"]["nodes"]
    finally:
        del LOSS


def test_objects_with_hostile_attribute_access_are_never_touched(keep: Any) -> None:
    calls: list[str] = []

    class Proxy:
        def __getattribute__(self, name: str) -> Any:
            calls.append(name)
            raise RuntimeError(f"the census must not read {name}")

        @property
        def payload(self) -> Any:
            calls.append("payload")
            raise RuntimeError("the census must not run a property")

    proxy = Proxy()
    object.__setattr__(proxy, "kept", torch.zeros(7))
    keep["proxy"] = proxy
    del proxy
    doc = census()
    assert calls == []
    held = [h for h in doc["holders"] if [7] in h["shapes"]]
    assert [h["holder"] for h in held] == [f"{__name__}.KEEP[…].kept"]


class Node:
    pass


def test_many_cycles_and_native_holders_are_sorted_as_the_collector_would() -> None:
    # Forty of each: more than gc.get_referrers is asked about at once, so the census scans.
    import gc

    enabled = gc.isenabled()
    gc.disable()
    futures = []
    try:
        for _ in range(40):
            node = Node()
            node.me, node.t = node, torch.zeros(3)
            future = torch.futures.Future()
            future.set_result(torch.zeros(5))
            futures.append(future)
        del node, future
        doc = census()
        cycles = _holder(doc, f"unreachable cycle (awaiting gc): {__name__}.Node.t")
        native = _holder(doc, "held from native code (no Python referrer)")
        assert cycles is not None and cycles["tensors"] == 40 and cycles["bytes"] == 40 * 12
        assert native is not None and native["tensors"] >= 40 and [5] in native["shapes"]
        gc.collect()
        assert _holder(census(), f"unreachable cycle (awaiting gc): {__name__}.Node.t") is None
    finally:
        if enabled:
            gc.enable()


def test_bad_bounds_are_refused() -> None:
    for kwargs in ({"max_seconds": 0}, {"max_seconds": -1}, {"max_depth": 0}, {"top": -1}):
        with pytest.raises(ValueError):
            census(**kwargs)


def test_top_keeps_the_largest_holders_and_counts_the_rest(keep: Any) -> None:
    keep["big"] = torch.zeros(1 << 20)
    full, top = census(), census(top=1)
    assert len(top["holders"]) == 1 and top["holders_omitted"] == len(full["holders"]) - 1
    assert top["holders"][0] == full["holders"][0] and top["totals"] == full["totals"]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": ":".join(sys.path), "PATH": "/usr/bin:/bin"},
    )


def test_importing_leaklab_imports_no_torch() -> None:
    done = _python("""
        import sys
        import leaklab, leaklab.census, leaklab.asgi
        assert "torch" not in sys.modules, "importing leaklab imported torch"
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_process_that_never_imported_torch_gets_an_empty_census_and_no_torch() -> None:
    # The watch takes a census before its first look, into services that may never use torch:
    # importing it there would add ~270 MB and seconds of CPU to the user's process.
    done = _python("""
        import json, sys
        from leaklab.census import census
        doc = census()
        print(json.dumps([doc["torch"], doc["totals"]["tensors"], len(doc["holders"]), "torch" in sys.modules]))
    """)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["not imported", 0, 0, False]


def test_without_torch_the_census_says_so_and_the_agent_answers_409() -> None:
    done = _python("""
        import asyncio, importlib.abc, json, sys

        class NoTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("No module named 'torch' (hidden by the test)")

        sys.meta_path.insert(0, NoTorch())
        from leaklab.asgi import LeaklabDebug
        from leaklab.census import CensusError, census
        try:
            census()
        except CensusError as e:
            print("census:", e)
        sys.path.insert(0, sys.argv[-1]) if False else None

        async def app(scope, receive, send):
            raise AssertionError("not for the app")

        async def get(path):
            sent = []
            scope = {"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": [],
                     "client": ("127.0.0.1", 1)}
            async def receive():
                return {"type": "http.request"}
            async def send(m):
                sent.append(m)
            await LeaklabDebug(app)(scope, receive, send)
            return sent[0]["status"], json.loads(sent[1]["body"])

        for path in ("/debug/leaklab/tensors", "/debug/leaklab/snapshot", "/debug/leaklab/stats"):
            status, doc = asyncio.run(get(path))
            print(path, status, doc.get("error", doc.get("schema")))
    """)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("census: the tensor census needs torch") and "cannot import it" in lines[0]
    assert lines[1].startswith("/debug/leaklab/tensors 409 the tensor census needs torch")
    assert lines[2].startswith("/debug/leaklab/snapshot 409 torch is not imported in this process")
    assert lines[3] == "/debug/leaklab/stats 200 leaklab.stats/1"


def test_tensors_frozen_by_gc_freeze_are_still_found() -> None:
    # gc.freeze() (pre-fork servers call it) hides objects from gc.get_objects(); the walk
    # reaches them anyway. In this process, the freeze undone after the census: a fresh one
    # imported torch again (2.1 to 2.5 s of CPU) for a census of four tensors.
    global HISTORY
    import gc

    HISTORY = [torch.zeros(8) for _ in range(3)]
    gc.freeze()
    try:
        HISTORY.append(torch.zeros(8))
        doc = census()
    finally:
        gc.unfreeze()
        del HISTORY
    held = _holder(doc, f"{__name__}.HISTORY")
    assert doc["frozen"] > 0 and held is not None, [h["holder"] for h in doc["holders"]]
    assert (held["tensors"], held["bytes"]) == (4, 128)


def test_census_error_is_a_runtime_error() -> None:
    assert issubclass(CensusError, RuntimeError)


def test_the_document_has_exactly_the_fields_its_typeddicts_name(keep: Any) -> None:
    from leaklab.census import CensusDoc, GraphStats, Holder, Phases, Totals

    w = torch.randn(2, 2, requires_grad=True)
    keep["loss"] = (w * 2).sum()
    del w
    doc = census()
    assert set(doc) == CensusDoc.__required_keys__
    assert set(doc["totals"]) == Totals.__required_keys__ and set(doc["phases"]) == Phases.__required_keys__
    for h in doc["holders"]:
        assert set(h) == Holder.__required_keys__ and set(h["graph"]) == GraphStats.__required_keys__
    json.loads(json.dumps(doc))  # plain JSON all the way down


def test_a_closure_is_named_where_the_application_keeps_it_not_by_a_memo_cache() -> None:
    import functools
    import types

    def make_handler(x: torch.Tensor) -> Any:
        def handler() -> torch.Tensor:
            return x

        return handler

    @functools.cache
    def facts(fn: Any) -> str:  # a framework's memo of facts about each endpoint
        return str(fn.__qualname__)

    handler = make_handler(torch.zeros(250))
    facts(handler)
    app = types.ModuleType("leaklab_memo_case")
    # The memo first, and its path as short as the application's (module, cache dict, key
    # tuple, function; module, dict, dict, list, function): breadth first, it would win.
    app.MEMO = facts  # type: ignore[attr-defined]
    app.APP = {"routes": {"predict": [handler]}}  # type: ignore[attr-defined]
    sys.modules[app.__name__] = app
    del handler
    try:
        doc = census()
    finally:
        del sys.modules[app.__name__]
    name = "leaklab_memo_case.APP[…][…][…] → " + make_handler.__qualname__ + ".<locals>.handler → cell 'x'"
    held = _holder(doc, name)
    names = [h["holder"] for h in doc["holders"] if "memo" in h["holder"]]
    assert held is not None, names
    assert held["kind"] == "closure" and held["bytes"] == 1000 and held["tensors"] == 1


def test_a_global_module_hook_is_named_by_torchs_hook_dict() -> None:
    from torch.nn.modules import module as nn_module

    def make_hook(x: torch.Tensor) -> Any:
        def hook(mod: torch.nn.Module, inputs: Any, output: Any) -> None:
            assert x.numel() == 300

        return hook

    handle = nn_module.register_module_forward_hook(make_hook(torch.zeros(300)))
    try:
        doc = census()
    finally:
        handle.remove()
    name = f"torch.nn.modules.module._global_forward_hooks[…] → {make_hook.__qualname__}.<locals>.hook → cell 'x'"
    held = _holder(doc, name)
    assert held is not None, [h["holder"] for h in doc["holders"] if "hook" in h["holder"]]
    assert held["kind"] == "closure" and held["bytes"] == 1200 and held["tensors"] == 1

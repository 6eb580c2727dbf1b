"""leaklab: the memory leaks of PyTorch inference services, found, explained and guarded.

The heavy work is done by the ``leaklab`` binary shipped in this wheel (``leaklab scan``,
``leaklab snapshot``); this package holds what must run inside your own process:

- :mod:`leaklab.asgi`: ``LeaklabDebug``, an ASGI middleware that answers "which object keeps
  the memory alive" with a tensor census (``/debug/leaklab/tensors``).
- :mod:`leaklab.census`: the tensor census itself, as a function.
- :mod:`leaklab.pytest_plugin`: the ``leak_check`` fixture and marker (registered on install).
- :func:`serve_agent` (:mod:`leaklab.serve`): the agent's routes from a process that serves no
  HTTP of its own (an inference worker), on loopback, registered in the workers' folder.

Importing ``leaklab`` imports no torch: the parts that need it import it when they run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leaklab._find_bin import LeaklabNotFound, find_leaklab_bin

if TYPE_CHECKING:
    from leaklab.serve import AgentServer, serve_agent

__all__ = ["AgentServer", "LeaklabNotFound", "__version__", "find_leaklab_bin", "serve_agent"]


def __getattr__(name: str) -> Any:
    """``serve_agent`` and ``AgentServer`` imported when first named: ``leaklab.serve`` brings
    asyncio and http.server, which the pytest plugin (imported in every pytest run once the wheel
    is installed) never needs."""
    if name in ("AgentServer", "serve_agent"):
        from leaklab import serve

        return getattr(serve, name)
    raise AttributeError(f"module 'leaklab' has no attribute {name!r}")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("leaklab")
    except PackageNotFoundError:  # run from a source tree, not installed
        return "0+unknown"


__version__ = _version()

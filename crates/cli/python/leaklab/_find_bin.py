"""Where the ``leaklab`` binary of this installation is, the way uv's and ruff's packages find theirs."""

from __future__ import annotations

import os
import sys
import sysconfig


class LeaklabNotFound(FileNotFoundError):
    """No ``leaklab`` binary beside this package: the wheel was not installed, only its sources copied."""


def find_leaklab_bin() -> str:
    """The path of the ``leaklab`` binary that this package was installed with.

    ``LEAKLAB_BIN`` wins when set (a binary built from source, say); then the scripts folder of
    this Python, of its base prefix, of the user scheme (``pip install --user``), and the
    ``bin/`` folder above the package (``pip install --target`` or ``--prefix``).
    """
    override = os.environ.get("LEAKLAB_BIN")
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise LeaklabNotFound(f"LEAKLAB_BIN={override} is not an executable file")
    exe = "leaklab" + (sysconfig.get_config_var("EXE") or "")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    candidates = [
        sysconfig.get_path("scripts"),
        sysconfig.get_path("scripts", vars={"base": sys.base_prefix}),
        sysconfig.get_path("scripts", scheme=sysconfig.get_preferred_scheme("user")),
        # `pip install --target DIR` puts the package in DIR and the binary in DIR/bin.
        os.path.join(package_root, "bin"),
        # `pip install --prefix P` puts the package in P/lib/pythonX.Y/site-packages.
        os.path.join(package_root, os.pardir, os.pardir, os.pardir, "bin"),
    ]
    for folder in candidates:
        path = os.path.join(folder, exe)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.normpath(path)
    searched = "\n  ".join(os.path.normpath(c) for c in candidates)
    raise LeaklabNotFound(
        f"the leaklab binary was not found; searched:\n  {searched}\n"
        "Install the wheel (pip install leaklab) or set LEAKLAB_BIN to a leaklab binary."
    )

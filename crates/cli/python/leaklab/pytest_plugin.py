"""pytest plugin registered by the wheel's ``pytest11`` entry point (the ``leak_check`` fixture is being built)."""

"""Public names a package loads on first use (PEP 562), for ``rewindfs.store`` and
``rewindfs.overlay``: importing one of their submodules — the CLI's first of all — then
does not load everything the package re-exports (LMDB, trio, pyfuse3)."""

from __future__ import annotations

import importlib


def lazy_names(package: str, public: dict[str, str], namespace: dict):
    """A module ``__getattr__`` for *package*: name ``n`` of ``public`` is imported from
    submodule ``public[n]`` when first asked for, then kept in *namespace* (the
    package's globals), so the next lookup is a plain attribute."""

    def __getattr__(name: str):
        module = public.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    return __getattr__

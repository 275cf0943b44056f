"""Importing the module a ``--handler module:name`` names (I/O: the import system).

Rules
- A module is found in the installed packages, else in the current directory, where
  ``python -m`` looks too (an installed console script such as ``fencectl`` does not put
  the current directory on ``sys.path`` by itself). The directory is searched last, so a
  folder of the user's named like one of fenceworker's packages cannot replace it.
- A module that is not found raises ``ConfigError`` naming it and where it was looked for;
  an ImportError raised inside the module is reported as that module's own.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from fencing.errors import ConfigError

__all__ = ["import_module_of"]


def import_module_of(spec: str, module_name: str) -> ModuleType:
    """``module_name`` of the handler ``spec``, imported (see the module Rules)."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)
        importlib.invalidate_caches()
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise ConfigError(
                f"--handler {spec!r}: cannot import {module_name!r}: no module named "
                f"{missing!r} in the current directory ({here}) or in the environment "
                f"{sys.prefix}") from exc
        raise ConfigError(f"--handler {spec!r}: cannot import {module_name!r}: {exc}") from exc
    except ImportError as exc:
        raise ConfigError(f"--handler {spec!r}: cannot import {module_name!r}: {exc}") from exc

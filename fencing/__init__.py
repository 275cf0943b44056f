"""fencing: the PostgreSQL fence store, outcome classification, the three-call policy."""
from fencing.errors import *  # noqa: F403
from fencing.errors import __all__ as _errors_all
from fencing.types import *  # noqa: F403
from fencing.types import __all__ as _types_all

__all__ = [*_errors_all, *_types_all]

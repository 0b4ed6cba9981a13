"""Names of an earlier release kept for one more: :func:`renamed`, a callable under its old name that warns with its
new one (the CHANGELOG lists each)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["renamed"]

P = ParamSpec("P")
R = TypeVar("R")


def renamed(new: Callable[P, R], old: str, module: str) -> Callable[P, R]:
    """``new`` under its old name ``old``, for one more release: each call warns (``DeprecationWarning``) with the new
    name, then does what ``new`` does. Typed as ``new``, so that code using the old name still type-checks.

    Args:
        new: the callable as it is named now.
        old: its name before.
        module: the module the user imports both from, for the warning.

    Returns:
        A callable named ``old`` that calls ``new``.

    Example: ``add_reload = renamed(reloading, "add_reload", "tlsreload_plugins.gunicorn")``.
    """
    now = getattr(new, "__name__", repr(new))

    @functools.wraps(new)
    def old_name(*args: P.args, **kwargs: P.kwargs) -> R:
        warnings.warn(f"{module}.{old} is deprecated: it is {now} now, as in every glue", DeprecationWarning, 2)
        return new(*args, **kwargs)

    old_name.__name__ = old_name.__qualname__ = old
    old_name.__doc__ = f"Deprecated: :func:`{now}` (this name works for one more release, and warns)."
    return old_name

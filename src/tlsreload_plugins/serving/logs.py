"""Show the package's log lines where the server shows its own: its handlers, format and level.

Servers configure their own logging (gunicorn's error log, uvicorn's ``uvicorn.error``, hypercorn's
error logger) and leave the root logger bare, so ``tlsreload_plugins`` lines would otherwise be
lost or shown in another format. Both functions leave logging alone where the application has
configured it for this package itself.
"""

from __future__ import annotations

import copy
import logging

__all__ = ["forward_to", "share_handlers"]

PACKAGE = "tlsreload_plugins"

_shared: list[logging.Handler] = []
"""The handlers :func:`share_handlers` gave the package's logger (any others were configured by the user)."""


class _Forward(logging.Handler):
    """Hands each record to another logger, its message prefixed (the server's format shows no logger name)."""

    def __init__(self, target: logging.Logger, prefix: str) -> None:
        super().__init__()
        self.target = target
        self.prefix = prefix

    def emit(self, record: logging.LogRecord) -> None:
        record = copy.copy(record)
        record.msg = f"{self.prefix}{record.msg}"
        self.target.handle(record)


def forward_to(target: logging.Logger | None, prefix: str = "tlsreload: ") -> None:
    """Send the package's lines through ``target`` (the server's error logger), prefixed, at its level.

    Left alone when ``target`` is not a logger (the server's error log is off), or when the
    application configured logging itself (a handler on the root logger or on ``tlsreload_plugins``).

    Example::

        forward_to(logging.getLogger("uvicorn.error"))
    """
    ours = logging.getLogger(PACKAGE)
    if not isinstance(target, logging.Logger) or ours.handlers or logging.getLogger().handlers:
        return
    ours.addHandler(_Forward(target, prefix))
    ours.setLevel(target.getEffectiveLevel())
    ours.propagate = False


def share_handlers(target: logging.Logger | None) -> None:
    """Give the package's logger ``target``'s own handlers and level (gunicorn's error log), and no
    second copy through the root logger. Called again (gunicorn's HUP gives its error log new handlers
    and maybe a new level), it follows them. Left alone when the package's logger has handlers that
    did not come from here."""
    global _shared
    ours = logging.getLogger(PACKAGE)
    if not isinstance(target, logging.Logger) or ours.handlers not in ([], _shared):
        return
    _shared = list(target.handlers)
    ours.handlers = list(_shared)
    ours.setLevel(target.level)
    ours.propagate = False

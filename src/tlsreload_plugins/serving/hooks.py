"""Glue that lives in a server's own configuration: its hooks beside the user's, and the command line.

Servers configured through hooks (functions a configuration file defines, called at points of the
server's life) take one function per name, and may check its arity. Glue that needs the same point
as the user wraps the user's hook:

* :func:`before` and :func:`after`: one hook calling ours and theirs, with our hook's signature;
* :func:`made_by`: whether the hook in effect is still one of ours (a hook defined later replaces it);
  :func:`still_ours` logs why nothing is reloaded when it is not;
* :class:`Aside`: a flag our hook reads to step aside while our own code calls the server's builder,
  which calls the hook;
* :func:`option_value`: an option of a command line the server parses, such as its configuration's;
* :func:`imported_again_on`: a configuration module the server imports once is imported again when it
  reloads its configuration.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import threading
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any, TypeVar, cast

__all__ = ["Aside", "after", "before", "imported_again_on", "made_by", "option_value", "still_ours"]

F = TypeVar("F", bound=Callable[..., Any])


def before(ours: F, theirs: Callable[..., object] | None) -> F:
    """A hook that calls ``ours``, then ``theirs`` (when given), with the same arguments.

    It has the name and signature of ``ours`` (``inspect.signature`` follows it); ``theirs`` does not run
    when ``ours`` raises or exits. Returns ``ours`` itself when ``theirs`` is ``None``.

    Example: ``settings["on_reload"] = before(forget_drop_in, settings.get("on_reload"))``.
    """
    if theirs is None:
        return ours

    @functools.wraps(ours)
    def ours_then_theirs(*args: Any, **kwargs: Any) -> Any:
        ours(*args, **kwargs)
        return theirs(*args, **kwargs)

    return cast(F, ours_then_theirs)


def after(theirs: Callable[..., object] | None, ours: F) -> F:
    """A hook that calls ``theirs`` (when given), then ``ours`` even when ``theirs`` raises, with the same
    arguments; it has the name and signature of ``ours``. Returns ``ours`` itself when ``theirs`` is ``None``.

    Example: ``hooks["worker_exit"] = after(user_worker_exit, stop_checking)``.
    """
    if theirs is None:
        return ours

    @functools.wraps(ours)
    def theirs_then_ours(*args: Any, **kwargs: Any) -> Any:
        try:
            theirs(*args, **kwargs)
        finally:
            result = ours(*args, **kwargs)
        return result

    return cast(F, theirs_then_ours)


def made_by(hook: object, maker: Callable[..., object]) -> bool:
    """Whether ``hook`` is a function defined inside ``maker`` (one of the hooks it returned): how glue tells
    its own hook, still in effect, from one the user's configuration defined after it."""
    return getattr(hook, "__qualname__", "").startswith(f"{maker.__qualname__}.")


def still_ours(hook: object, maker: Callable[..., object], name: str, log: logging.Logger) -> bool:
    """Whether the ``name`` hook in effect is one ``maker`` made (:func:`made_by`). When it is not, one defined after
    ``maker(globals())`` replaced ours: the server never asks us for a context, so a reloader would claim reloads no
    handshake gets; one ERROR line on ``log`` says that this worker's certificate is not reloaded, and why.

    Returns:
        ``True`` when the hook is ours; ``False``, after the ERROR line, when not.

    Example: ``if still_ours(cfg.ssl_context, reloading, "ssl_context", log): start_reloading()``.
    """
    if made_by(hook, maker):
        return True
    call = f"{maker.__name__}(globals())"
    log.error(
        "the %s hook in effect (%s) is not tlsreload's: one defined after %s replaces it, and this worker's "
        "certificate is NOT reloaded; call %s last",
        name,
        getattr(hook, "__qualname__", repr(hook)),
        call,
        call,
    )
    return False


class Aside(threading.local):
    """A flag of the current thread: set for the length of a ``with`` block, read as ``bool(aside)``.

    Example: a hook of ours that the server's builder calls returns the user's context, not the live
    one, while a reload calls that builder::

        with building:
            context = server_builds_its_context()  # calls our hook, which sees `building` set
    """

    active: bool = False

    def __enter__(self) -> None:
        self.active = True

    def __exit__(self, *exc_info: object) -> None:
        self.active = False

    def __bool__(self) -> bool:
        return self.active


def option_value(args: Sequence[str], *names: str) -> str | None:
    """The value the command line ``args`` gives the option ``names`` (such as ``"-c", "--config"``), read as
    argparse reads it (the last one given; ``-cX``, ``--config=X``, abbreviations); ``None`` when absent, or
    when ``args`` do not parse as such a command line (a custom application's).

    Example: ``option_value(["-c", "mine.conf.py", "app:app"], "-c", "--config") == "mine.conf.py"``.
    """
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(*names, dest="value")
    try:
        known, _ = parser.parse_known_args(list(args))
    except SystemExit:  # argparse's reaction to a command line it cannot parse: no value to find
        return None
    value: str | None = known.value
    return value


def imported_again_on(settings: MutableMapping[str, Any], module: str, *hooks: str) -> None:
    """Make each hook of ``settings`` named in ``hooks`` (hooks called with the server) first forget the module
    named ``module``, then run as before: a server that imports a configuration *module* once, but reads a
    configuration *file* again when it reloads (its ``hooks``), then imports the module, and what it reads,
    again.

    Example: ``imported_again_on(settings, __name__, "on_starting", "on_reload")`` in a configuration module.
    """

    def forget_module(server: Any) -> None:
        sys.modules.pop(module, None)

    for name in hooks:
        settings[name] = before(forget_module, settings.get(name))

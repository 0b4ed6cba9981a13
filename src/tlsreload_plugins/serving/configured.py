"""How servers build their TLS context, as recipes: the plain server context, and a server's own builder
over its configuration object, aimed at other files.

* :func:`server_context`: the context most servers build from their settings, with the key's password
  (for a server whose own factory takes none, and for glue that only needs OpenSSL's verdict).
* A server configured by an object (its settings as attributes): its files (:func:`config_files`), its
  recipes (:func:`config_recipes`), its reloader (:func:`start_from_config`) and its check at start
  (:func:`check_config_at_start`).
* :func:`parameter_names`: what the server's own function takes, in the version installed (a keyword
  argument an older one lacks is not passed; a way in that is gone stops the start).

A recipe must build with the server's own code, so that its ciphers, ALPN, verify mode and options apply on
every reload; aimed at other files (an SNI identity, the last good identity), it builds from a copy of the
configuration naming them. The key password is the server's own setting, else the one of
``$TLSRELOAD_KEY_PASSWORD_FILE``, put where the server reads its own and read again for every build (a new
password may come with a new key). Nothing here knows a server.
"""

from __future__ import annotations

import copy
import functools
import inspect
import ssl
from collections.abc import Callable, Sequence
from typing import TypeVar

from tlsreload_plugins.examine import Recipe
from tlsreload_plugins.files import Password, TLSFiles, password_text
from tlsreload_plugins.memory_files import RecipeFor
from tlsreload_plugins.publication.reader import ReaderProcess
from tlsreload_plugins.reloader import Reloader
from tlsreload_plugins.serving.start import CannotServe, Settings, Waiting, check_at_start, start_reloader
from tlsreload_plugins.settings import resolve_password

__all__ = [
    "check_config_at_start",
    "config_files",
    "config_recipes",
    "parameter_names",
    "server_context",
    "start_from_config",
]

C = TypeVar("C")


def server_context(
    files: TLSFiles,
    password: Password = None,
    *,
    verify_mode: ssl.VerifyMode | int | None = None,
    ciphers: str | None = None,
    alpn: Sequence[str] | None = None,
) -> ssl.SSLContext:
    """``ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)`` holding the chain and key of ``files`` (the key
    opened with ``password``) and their client-CA bundle, then ``verify_mode``, ``ciphers`` and the ``alpn``
    protocols, each where given.

    Raises:
        ssl.SSLError, OSError, ValueError: as :meth:`ssl.SSLContext.load_cert_chain` and the setters raise them.

    Example: ``server_context(files, password, verify_mode=ssl.CERT_REQUIRED, alpn=["h2", "http/1.1"])``.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.certfile, files.keyfile, password)
    if files.ca_certs:
        context.load_verify_locations(files.ca_certs)
    if verify_mode is not None:
        context.verify_mode = ssl.VerifyMode(verify_mode)
    if ciphers:
        context.set_ciphers(ciphers)
    if alpn:
        context.set_alpn_protocols(alpn)
    return context


@functools.cache
def parameter_names(function: Callable[..., object]) -> frozenset[str]:
    """The names of the parameters ``function`` (a class: its constructor) takes, inspected once per function.

    Example: ``if "alpn_protocols" in parameter_names(create_ssl_context): kwargs["alpn_protocols"] = alpn``.
    """
    return frozenset(inspect.signature(function).parameters)


def config_files(config: object, names: tuple[str, str, str, str]) -> TLSFiles:
    """The certificate, key and client-CA files ``config`` names (``names`` as for :func:`config_recipes`)."""
    certfile, keyfile, ca_certs = (getattr(config, name) for name in names[:3])
    return TLSFiles(str(certfile), str(keyfile) if keyfile else None, str(ca_certs) if ca_certs else None)


def config_recipes(
    config: C,
    build: Callable[[C], ssl.SSLContext],
    *,
    names: tuple[str, str, str, str],
    password: Password,
    own: Recipe | None = None,
) -> tuple[Recipe, RecipeFor]:
    """The recipe and the recipe aimed at other files (``recipe_for``) of a server configured by ``config``.

    Args:
        config: the server's configuration object.
        build: the server's own code building its context from such an object.
        names: the attributes of ``config`` naming the certificate, key and client-CA files, and the key password.
        password: the key password (:func:`~tlsreload_plugins.settings.resolve_password` of the server's own):
            when the server's own is unset, each build gets its text, read then.
        own: the server's own factory for ``config`` as it is (one that reads ``config`` when called, so the
            password is set on ``config`` itself); by default the recipe is ``build(config)``.

    Returns:
        ``(recipe, recipe_for)``, as :func:`~tlsreload_plugins.serving.start.start_reloader` takes them.

    Example::

        names = ("certfile", "keyfile", "ca_certs", "keyfile_password")
        recipe, recipe_for = config_recipes(config, Config.create_ssl_context, names=names, password=password)
    """
    *files_names, password_name = names
    from_file = getattr(config, password_name) is None and password is not None

    def configured(files: TLSFiles | None) -> C:
        aimed = config if files is None and not from_file else copy.copy(config)
        if files is not None:
            for name, path in zip(files_names, (files.certfile, files.keyfile, files.ca_certs), strict=True):
                setattr(aimed, name, path)
        if from_file:
            setattr(aimed, password_name, password_text(password))
        return aimed

    def recipe() -> ssl.SSLContext:
        if own is None:
            return build(configured(None))
        if from_file:  # the server's own factory reads the password from its configuration
            setattr(config, password_name, password_text(password))
        return own()

    def recipe_for(files: TLSFiles) -> ssl.SSLContext:
        return build(configured(files))

    return recipe, recipe_for


def start_from_config(
    config: C,
    build: Callable[[C], ssl.SSLContext],
    *,
    names: tuple[str, str, str, str],
    settings: Settings,
    own: Recipe | None = None,
    waiting: Waiting | None = None,
    publication: str | None = None,
) -> Reloader:
    """:func:`~tlsreload_plugins.serving.start.start_reloader` for the files ``config`` names, with its recipes and
    key password (arguments as for :func:`config_recipes` and ``start_reloader``).

    Raises:
        CannotServe: ``config`` names no certificate file; nothing can be served and this process may not wait
            (or a setting is bad).

    Example::

        reloader = start_from_config(config, Config.create_ssl_context, names=names, settings=Settings())
    """
    if not getattr(config, names[0]):
        raise CannotServe(f"tlsreload needs {names[0]} (and usually {names[1]}) set on the {type(config).__name__}")
    password = resolve_password(getattr(config, names[3]))
    recipe, recipe_for = config_recipes(config, build, names=names, password=password, own=own)
    files = config_files(config, names)
    return start_reloader(
        files,
        recipe,
        recipe_for,
        password=password,
        settings=settings,
        waiting=waiting,
        publication=publication,
    )


def check_config_at_start(
    config: C,
    build: Callable[[C], ssl.SSLContext],
    *,
    names: tuple[str, str, str, str],
    settings: Settings,
    reader: bool = False,
) -> ReaderProcess | None:
    """:func:`~tlsreload_plugins.serving.start.check_at_start` for the files ``config`` names, with its recipe and key
    password (arguments as for :func:`config_recipes` and ``check_at_start``; the reader it started, if any).

    Raises:
        CannotServe: a setting or the files are not usable.

    Example::

        reader = check_config_at_start(config, build, names=names, settings=settings, reader=True)
    """
    password = resolve_password(getattr(config, names[3]))
    recipe, _ = config_recipes(config, build, names=names, password=password)
    files = config_files(config, names)
    return check_at_start(files, recipe, password, settings, reader=reader)

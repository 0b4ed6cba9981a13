"""The exceptions a check raises when it cannot serve what is on disk: :class:`ReloadError` and its two
kinds, :class:`InvalidIdentity` (the files) and :class:`NotServable` (the server's set-up).

Their own module so that reading the files (:mod:`tlsreload_plugins.files`) and judging them
(:mod:`tlsreload_plugins.identity`) raise the same ones; the package exports them too.
"""

from __future__ import annotations


class ReloadError(Exception):
    """Why a check could not serve what is on disk. ``str(error)`` says it in words an operator can act on."""


class InvalidIdentity(ReloadError):
    """The files on disk do not make a usable TLS identity.

    ``str(error)`` names the file and says what is wrong with it, in words an operator can act on.

    Attributes:
        path: the file at fault, when one is (``None`` when the problem is the pair or the context).
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class Unjudged(InvalidIdentity):
    """The refusal of an identity validation stopped or ended over before its verdict (a hostile file, a crash
    of the child validating it): refused, as validation would not vouch for it, but not a verdict on its bytes."""


class NotServable(ReloadError):
    """The files are usable but the server cannot be moved onto them (the swap hook was replaced, a
    recipe handed back a context already in use): a bug or a conflict in the server's set-up."""

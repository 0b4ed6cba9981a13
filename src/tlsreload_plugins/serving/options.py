"""The ``--tls-*`` options a drop-in command adds to its server's own command line.

A drop-in command is the server's command, every option keeping the server's meaning, plus
``--tls-reload-interval``, ``--tls-sni``, ``--tls-metrics`` and ``--tls-crl`` (:data:`OPTION_HELP`): through
:func:`add_options` for a server whose command is argparse's, :func:`with_tls_options` for one whose
command is click's. Their values become a :class:`~tlsreload_plugins.serving.start.Settings`, whose bad
values are usage errors (exit 2) like any other option's:
``settings.check(as_options=True)`` names them (:func:`argparse_settings`, :func:`click_settings`). Nothing
here knows a server; click is imported only by the functions for a click command.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from tlsreload_plugins import __version__
from tlsreload_plugins.authorization import AUTHORIZE_ENV, parse_spiffe_id, trust_domain_of
from tlsreload_plugins.serving.start import Settings
from tlsreload_plugins.settings import CRL_ENV, INTERVAL_ENV, METRICS_ENV, MIN_INTERVAL, SNI_ENV, SPIFFE_ENV

if TYPE_CHECKING:  # a drop-in command's only: its workers, which import the glue too, have no use for them
    import argparse

    import click

__all__ = [
    "OPTION_HELP",
    "SPIFFE_FEDERATION_HELP",
    "SPIFFE_HELP",
    "SPIFFE_ID_HELP",
    "add_options",
    "argparse_settings",
    "click_settings",
    "spiffe_choice",
    "with_tls_options",
]

OPTION_HELP = {
    "--tls-reload-interval": "Seconds between checks of the TLS certificate files. "
    f"Defaults to ${INTERVAL_ENV}, else 1.",
    "--tls-sni": "A directory of more TLS identities, chosen by server name (SNI): a Kubernetes TLS Secret or "
    f"certbot lineage, or a directory of them. Repeatable. Defaults to ${SNI_ENV}.",
    "--tls-metrics": "Export Prometheus metrics of the TLS certificates (needs prometheus_client). "
    f"Defaults to ${METRICS_ENV}.",
    "--tls-crl": "A PEM file of certificate revocation lists for the CAs of the client-CA bundle, reloaded with it: "
    f"revoked client certificates are refused. Defaults to ${CRL_ENV}.",
    "--tls-spiffe-authorize": "Accept only clients whose certificate carries a SPIFFE ID this accepts, refused in "
    "their handshake otherwise: 'any', an ID (spiffe://example.org/web), a trust domain's members "
    "(spiffe://example.org), several of these separated by commas, or module:function (a matcher of the ID). "
    f"Client certificates are then required. Defaults to ${AUTHORIZE_ENV}.",
}
"""The options every drop-in command adds to its server's own, with their help."""

SPIFFE_HELP = (
    "Serve the X.509 SVID and trust bundle of SPIFFE's Workload API instead of certificate files: at the socket "
    f"given (--tls-spiffe=unix:///PATH), else at $SPIFFE_ENDPOINT_SOCKET. Defaults to ${SPIFFE_ENV}."
)
"""The help of ``--tls-spiffe``, which the drop-ins that can take their identity from SPIFFE add."""

SPIFFE_ID_HELP = (
    "With --tls-spiffe: serve the SVID with this SPIFFE ID (default: the Workload API's first, its default)."
)
SPIFFE_FEDERATION_HELP = (
    "With --tls-spiffe: trust the bundles of federated trust domains too, all the Workload API sends, or those given "
    "(--tls-spiffe-federation=partner.org,other.org); --tls-spiffe-authorize decides which of their members may "
    "connect."
)


def add_options(parser: argparse.ArgumentParser) -> None:
    """Add the :data:`OPTION_HELP` options to an argparse command line, as a group "tlsreload options":
    ``tls_reload_interval`` (float or None), ``tls_sni`` (list or None), ``tls_metrics`` (True or None),
    ``tls_crl`` (a path or None).

    Example::

        add_options(parser)
        options, rest = parser.parse_known_args()
        settings = argparse_settings(parser, options)
    """
    group = parser.add_argument_group("tlsreload options")
    help_of = OPTION_HELP
    group.add_argument("--tls-reload-interval", type=float, metavar="SECONDS", help=help_of["--tls-reload-interval"])
    group.add_argument("--tls-sni", action="append", metavar="DIR", help=help_of["--tls-sni"])
    group.add_argument("--tls-metrics", action="store_true", default=None, help=help_of["--tls-metrics"])
    group.add_argument("--tls-crl", metavar="PATH", help=help_of["--tls-crl"])
    group.add_argument("--tls-spiffe-authorize", metavar="WHO", help=help_of["--tls-spiffe-authorize"])


def with_tls_options(
    stock: click.Command, callback: Callable[..., object], *, after: str, spiffe: bool = False
) -> click.Command:
    """A server's own click command, with tlsreload's options: for a drop-in command.

    Args:
        stock: the server's command.
        callback: runs in place of the stock callback, with the stock parameters and ``tls_reload_interval``
            (a float >= 0.1, or None), ``tls_sni`` (a tuple), ``tls_metrics`` (a bool), ``tls_crl`` (a path or
            None) and ``tls_spiffe_authorize`` (a string or None).
        after: the options go after the last parameter whose name starts with it (the server's TLS options).
        spiffe: add ``--tls-spiffe[=SOCKET]`` too: the callback gets ``tls_spiffe`` (``None``: not given; ``""``:
            given without a socket; else the socket), ``tls_spiffe_id`` and ``tls_spiffe_federation`` (``None``,
            ``""``: every federated domain, else a comma-separated list): see :func:`spiffe_choice`.

    Returns:
        A copy of ``stock`` (help texts, defaults and environment variables unchanged) whose ``--version``
        also names this package.

    Example::

        with_tls_options(uvicorn.main, run, after="ssl_").main(args=args)
    """
    import click

    command = copy.copy(stock)
    params = [_with_our_version(param) if param.name == "version" else param for param in command.params]
    at = max(i for i, param in enumerate(params) if (param.name or "").startswith(after)) + 1
    ours = [
        click.Option(
            ["--tls-reload-interval"],
            type=click.FloatRange(min=MIN_INTERVAL),
            help=OPTION_HELP["--tls-reload-interval"],
        ),
        click.Option(["--tls-sni"], multiple=True, metavar="DIR", help=OPTION_HELP["--tls-sni"]),
        click.Option(["--tls-metrics"], is_flag=True, default=False, help=OPTION_HELP["--tls-metrics"]),
        click.Option(["--tls-crl"], metavar="PATH", help=OPTION_HELP["--tls-crl"]),
        click.Option(["--tls-spiffe-authorize"], metavar="WHO", help=OPTION_HELP["--tls-spiffe-authorize"]),
    ]
    if spiffe:  # a value is optional: give the socket with "=", or the next argument is taken as it
        ours.append(click.Option(["--tls-spiffe"], is_flag=False, flag_value="", metavar="[=SOCKET]", help=SPIFFE_HELP))
        ours.append(click.Option(["--tls-spiffe-id"], metavar="SPIFFE_ID", help=SPIFFE_ID_HELP))
        ours.append(
            click.Option(
                ["--tls-spiffe-federation"],
                is_flag=False,
                flag_value="",
                metavar="[=DOMAINS]",
                help=SPIFFE_FEDERATION_HELP,
            )
        )
    command.params = [*params[:at], *ours, *params[at:]]
    command.callback = callback
    return command


def click_settings(
    tls_reload_interval: float | None,
    tls_sni: Sequence[str],
    tls_metrics: bool,
    tls_crl: str | None = None,
    tls_spiffe_authorize: str | None = None,
) -> Settings:
    """The :class:`~tlsreload_plugins.serving.start.Settings` of the options :func:`with_tls_options` hands its
    callback, checked: a bad value, or a bad ``$TLSRELOAD_*`` variable, is the command's usage error.

    Raises:
        click.UsageError: a setting is not usable (exit 2), named as :meth:`~tlsreload_plugins.serving.Settings.check`
            names it.

    Example: ``settings = click_settings(tls_reload_interval, tls_sni, tls_metrics, tls_crl)``, once the server's own
    environment file is loaded (it may set ``$TLSRELOAD_*``).
    """
    import click

    def usage_error(message: str) -> NoReturn:
        raise click.UsageError(message)

    settings = Settings(
        tls_reload_interval, tls_sni or None, tls_metrics or None, tls_crl or None, tls_spiffe_authorize
    )
    return _checked(settings, usage_error)


def argparse_settings(parser: argparse.ArgumentParser, options: argparse.Namespace) -> Settings:
    """The :class:`~tlsreload_plugins.serving.start.Settings` of the options :func:`add_options` added to ``parser``,
    as parsed into ``options``, checked: a bad value, or a bad ``$TLSRELOAD_*`` variable, is the parser's usage error.

    Raises:
        SystemExit: a setting is not usable: ``parser.error`` (the usage and one line naming it as
            :meth:`~tlsreload_plugins.serving.Settings.check` does, exit 2).

    Example: ``settings = argparse_settings(parser, parser.parse_known_args()[0])``.
    """
    settings = Settings(
        options.tls_reload_interval, options.tls_sni, options.tls_metrics, options.tls_crl, options.tls_spiffe_authorize
    )
    return _checked(settings, parser.error)


def spiffe_choice(
    spiffe_id: str | None,
    federation: bool | str | Sequence[str] | None,
    names: tuple[str, str] = ("argument --tls-spiffe-id", "argument --tls-spiffe-federation"),
) -> tuple[str | None, bool | list[str]]:
    """Which SVID and which federated bundles ``--tls-spiffe-id`` and ``--tls-spiffe-federation`` (or a
    configuration's keys) ask for, checked: (the SPIFFE ID or ``None``, ``False`` / ``True`` / the trust domains), as
    :class:`~tlsreload_plugins.sources.spiffe.SpiffeSource` takes them.

    Args:
        spiffe_id: the SVID's ID, or ``None``.
        federation: ``None`` or ``False``: none; ``True`` or ``""``: every federated domain; else trust domains, as
            a list or one comma-separated string.
        names: how the two settings are named in errors.

    Raises:
        ValueError: a value that is not a SPIFFE ID or trust domain, named as ``names`` say.

    Example: ``spiffe_choice(None, "partner.org")`` is ``(None, ["partner.org"])``.
    """
    try:
        chosen = parse_spiffe_id(spiffe_id) if spiffe_id else None
    except ValueError as e:
        raise ValueError(f"{names[0]}: {e}") from None
    if federation is None or federation is False:
        return chosen, False
    if federation is True:
        return chosen, True
    given = federation.split(",") if isinstance(federation, str) else list(federation)
    domains = [part.strip() for part in given if part.strip()]
    try:
        return chosen, [trust_domain_of(domain) for domain in domains] if domains else True
    except ValueError as e:
        raise ValueError(f"{names[1]}: {e}") from None


def _checked(settings: Settings, usage_error: Callable[[str], NoReturn]) -> Settings:
    """``settings``, once :meth:`~tlsreload_plugins.serving.Settings.check` finds them usable; else
    ``usage_error`` of the message that names the bad one."""
    try:
        settings.check(as_options=True)
    except ValueError as e:
        usage_error(str(e))
    return settings


def _with_our_version(param: click.Parameter) -> click.Parameter:
    """The server's ``--version``, followed by a line naming this package."""
    import click

    stock_callback = param.callback
    param = copy.copy(param)

    def print_versions(ctx: click.Context, this: click.Parameter, value: Any) -> Any:
        try:
            return stock_callback(ctx, this, value) if stock_callback is not None else value
        except click.exceptions.Exit:
            click.echo(f"with tlsreload-plugins {__version__}")
            raise

    param.callback = print_versions
    return param

"""The ``tlsreload`` command: ``check`` a certificate/key pair, or run the ``demo``.

``tlsreload check`` decides exactly as a running reloader does (:func:`~tlsreload_plugins.files.read_files`,
:func:`~tlsreload_plugins.identity.validate`, then a real server context built by OpenSSL), so it can gate a
certbot deploy hook, a cert-manager workflow or a Kubernetes probe. Exit status:

* 0: the pair is usable and the certificate is valid now (and beyond ``--warn-days``);
* 1: the pair is not usable (a reloader would refuse it); the reason is on stderr;
* 2: the command line is wrong;
* 3: the pair is usable, but the certificate is expired, not yet valid, or expires within ``--warn-days``, or the
  CRLs (``--crl``) are past their ``nextUpdate``.

With ``--crl``, it also describes each CRL (issuer, ``nextUpdate``, how many revoked), names the CAs of the bundle
that no CRL covers, and which of the client certificates given with ``--client-cert`` the CRLs revoke.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from tlsreload_plugins import __version__
from tlsreload_plugins.demo import run as demo
from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.examine import load_identity
from tlsreload_plugins.files import TLSFiles, password_file, read_files
from tlsreload_plugins.identity import Leaf, serial_hex
from tlsreload_plugins.revocation import describe_crls, load_crls
from tlsreload_plugins.serving.configured import server_context
from tlsreload_plugins.settings import CRL_ENV, PASSWORD_FILE_ENV
from tlsreload_plugins.sni.discovery import discover, resolve_directories
from tlsreload_plugins.sni.summary import summarize
from tlsreload_plugins.watch import command as watch

EXIT_OK = 0
EXIT_UNUSABLE = 1
EXIT_USAGE = 2
EXIT_EXPIRY = 3


@dataclass(frozen=True)
class Verdict:
    """What ``check`` concluded about a usable pair: the exit status and, when not 0, why."""

    status: int
    reason: str | None


def read_password_file(path: str) -> bytes:
    """The key password stored in ``path``: its first line, without the line ending, exactly as the
    servers read ``$TLSRELOAD_KEY_PASSWORD_FILE`` (:func:`~tlsreload_plugins.files.password_file`)."""
    return password_file(path)()


def check_files(files: TLSFiles, password: bytes | None = None) -> Leaf:
    """Validate ``files`` as a reloader would, and build a real server context from them.

    Raises :class:`InvalidIdentity` with the reason when a reloader would refuse the files,
    including anything only OpenSSL rejects (a key too weak for the default security level, say).
    """
    _, leaf, _ = load_identity(files, lambda: server_context(files, password), password)
    return leaf


def judge_validity(leaf: Leaf, now: datetime, warn_days: float | None) -> Verdict:
    """Exit status for a usable ``leaf`` at ``now``: expired, not yet valid, or too close to expiry fail, and so do
    CRLs past their ``nextUpdate``."""
    revocation = leaf.revocation
    if revocation is not None and revocation.next_update is not None and now >= revocation.next_update:
        return Verdict(
            EXIT_EXPIRY,
            f"the CRL's nextUpdate passed at {revocation.next_update.isoformat()}: every client certificate is refused",
        )
    if now >= leaf.not_after:
        return Verdict(EXIT_EXPIRY, f"the certificate expired at {leaf.not_after.isoformat()}")
    if now < leaf.not_before:
        return Verdict(EXIT_EXPIRY, f"the certificate is not valid before {leaf.not_before.isoformat()}")
    days_left = (leaf.not_after - now).total_seconds() / 86400
    if warn_days is not None and days_left < warn_days:
        return Verdict(
            EXIT_EXPIRY,
            f"the certificate expires in {days_left:.1f} days ({leaf.not_after.isoformat()}), "
            f"within --warn-days {warn_days:g}",
        )
    return Verdict(EXIT_OK, None)


def describe_leaf(files: TLSFiles, leaf: Leaf, now: datetime) -> str:
    """The lines ``check`` prints about a usable pair."""
    days_left = (leaf.not_after - now).total_seconds() / 86400
    rows = [
        ("files", files.describe()),
        ("subject", leaf.subject or "-"),
        ("serial", leaf.serial),
        ("sans", ", ".join(leaf.sans) or "-"),
        ("not_before", leaf.not_before.isoformat()),
        ("not_after", leaf.not_after.isoformat()),
        ("days_left", f"{days_left:.1f}"),
        ("sha256", leaf.sha256),
    ]
    return "\n".join(f"{name + ':':<12}{value}" for name, value in rows)


def describe_revocation(files: TLSFiles, clients: Sequence[str]) -> list[str]:
    """The lines ``check`` prints about the CRLs of ``files`` (already validated): one per CRL, one per CA of the
    bundle no CRL covers, and one per client certificate (the files ``clients``) a CRL revokes.

    Raises:
        InvalidIdentity: a client certificate file cannot be read or parsed.
    """
    from cryptography import x509

    if not files.crl or not files.ca_certs:
        return []
    snapshot = read_files(files)
    assert snapshot.ca is not None and snapshot.crl is not None
    cas = x509.load_pem_x509_certificates(snapshot.ca)
    certs = []
    for path in clients:
        try:
            with open(path, "rb") as f:
                certs.append(x509.load_pem_x509_certificate(f.read()))
        except (OSError, ValueError) as e:
            raise InvalidIdentity(f"client certificate {path} cannot be read: {e}", path=path) from None
    lines = []
    for line, revoked in describe_crls(snapshot.crl, files.crl, cas, certs):
        lines.append(f"{'crl:':<12}{line}")
        lines += [
            f"{'revokes:':<12}serial {serial_hex(cert.serial_number)} subject={cert.subject.rfc4514_string() or '-'}"
            for cert in revoked
        ]
    covered = {crl.issuer for crl in load_crls(snapshot.crl, files.crl)}
    lines += [
        f"{'no_crl:':<12}{ca.subject.rfc4514_string() or '-'} (its client certificates are all refused)"
        for ca in cas
        if ca.subject not in covered
    ]
    return lines


def _non_negative_days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of days, got {value!r}") from None
    if not days >= 0 or days == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of days >= 0, got {value!r}")
    return days


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value!r}")
    return number


def _positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {value!r}")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``tlsreload`` (also used by tests to validate example commands)."""
    parser = argparse.ArgumentParser(
        prog="tlsreload", description="TLS certificates kept fresh in running Python servers and clients: tools."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = commands.add_parser(
        "check",
        help="validate a certificate/key pair exactly as the reloader would",
        description="Validate a certificate/key pair exactly as the reloader would, and describe the certificate. "
        "Exit 0: usable and valid now; 1: unusable (reason on stderr); 2: bad command line; "
        "3: usable but expired, not yet valid, or expiring within --warn-days.",
    )
    # Each server's own spellings too, so that a server's options can be pasted as they are.
    check.add_argument(
        "directory",
        nargs="?",
        metavar="DIR",
        help="instead of --cert: a directory of SNI identities (or one identity), as --tls-sni takes it; prints "
        "one summary line and a line per identity refused",
    )
    check.add_argument(
        "--cert",
        "--certfile",
        "--ssl-certfile",
        dest="cert",
        metavar="PATH",
        help="certificate chain (PEM), leaf first (also --certfile, --ssl-certfile); required without DIR",
    )
    check.add_argument(
        "--each", action="store_true", help="with DIR: also a line per identity (name, serial, expiry, names)"
    )
    check.add_argument(
        "--key",
        "--keyfile",
        "--ssl-keyfile",
        dest="key",
        metavar="PATH",
        help="private key (PEM); omit when it is in the --cert file (also --keyfile, --ssl-keyfile)",
    )
    check.add_argument(
        "--ca",
        "--ca-certs",
        "--ssl-ca-certs",
        dest="ca",
        metavar="PATH",
        help="client CA bundle (PEM) the server verifies clients against (also --ca-certs, --ssl-ca-certs)",
    )
    check.add_argument(
        "--crl",
        "--tls-crl",
        dest="crl",
        metavar="PATH",
        help=f"CRLs (PEM) for the CAs of --ca, as the servers read ${CRL_ENV} (also --tls-crl)",
    )
    check.add_argument(
        "--client-cert",
        action="append",
        metavar="PATH",
        help="with --crl: a client certificate (PEM) to say whether the CRLs revoke it; repeatable",
    )
    check.add_argument(
        "--password-file",
        metavar="PATH",
        help=f"file whose first line is the key's password, as the servers read ${PASSWORD_FILE_ENV} "
        f"(default: ${PASSWORD_FILE_ENV})",
    )
    check.add_argument(
        "--warn-days",
        type=_non_negative_days,
        metavar="DAYS",
        help="also exit 3 when the certificate expires within DAYS days (default: only when already expired)",
    )

    demo = commands.add_parser(
        "demo",
        help="start a real server with reload on and rotate its certificate a few times",
        description="Mint a throwaway CA, start a real TLS server with reload on, rotate its certificate the way "
        "kubelet does, and show what a new client connection gets after each rotation. Cleans up after itself.",
    )
    demo.add_argument("--server", choices=("uvicorn", "gunicorn"), default="uvicorn", help="default: uvicorn")
    demo.add_argument("--rotations", type=_positive_int, default=3, metavar="N", help="default: 3")
    demo.add_argument(
        "--interval", type=_positive_seconds, default=0.5, metavar="SECONDS", help="check interval (default: 0.5)"
    )
    demo.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="give up when the server does not start or serve a rotation within this time (default: 60)",
    )
    watch.add_parser(commands)
    return parser


def run_check_directory(args: argparse.Namespace) -> int:
    """``tlsreload check DIR``: check every SNI identity in ``DIR`` as a server would; print one summary line,
    one line per identity refused (and, with ``--each``, per identity); return the exit status: 1 when one is
    unusable, else 3 when one is outside its validity period or within ``--warn-days``, else 0."""
    try:
        path = args.password_file or os.environ.get(PASSWORD_FILE_ENV)
        password = read_password_file(path) if path else None
        found = discover(resolve_directories([args.directory]), args.ca or None)
    except (InvalidIdentity, ValueError) as e:
        print(f"tlsreload check: NOT USABLE: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    now = datetime.now(timezone.utc)
    leaves: dict[str, Leaf] = {}
    refused: dict[str, str] = {}
    late: dict[str, str] = {}
    for name, files in found.items():
        try:
            leaves[name] = leaf = check_files(files, password)
        except InvalidIdentity as e:
            refused[name] = str(e)
            continue
        verdict = judge_validity(leaf, now, args.warn_days)
        if verdict.reason is not None:
            late[name] = verdict.reason
        if args.each:
            print(
                f"{name}: serial {leaf.serial}, not after {leaf.not_after.isoformat()}, {', '.join(leaf.sans) or '-'}"
            )
    print(summarize(leaves, refused, len(found)).line())
    for name, why in {**late, **refused}.items():
        print(f"{name}: {'NOT USABLE: ' if name in refused else ''}{why}", file=sys.stderr)
    return EXIT_UNUSABLE if refused else EXIT_EXPIRY if late else EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    """``tlsreload check``: print the certificate's details; return the exit status."""
    if args.directory is not None:
        return run_check_directory(args)
    files = TLSFiles(args.cert, args.key or None, args.ca or None, args.crl or None)
    if files.crl and not files.ca_certs:
        print("tlsreload check: --crl needs --ca, the client-CA bundle it revokes certificates of", file=sys.stderr)
        return EXIT_USAGE
    try:
        path = args.password_file or os.environ.get(PASSWORD_FILE_ENV)
        password = read_password_file(path) if path else None
        leaf = check_files(files, password)
        crl_lines = describe_revocation(files, args.client_cert or [])
    except InvalidIdentity as e:
        print(f"tlsreload check: NOT USABLE: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    now = datetime.now(timezone.utc)
    print(describe_leaf(files, leaf, now))
    for line in crl_lines:
        print(line)
    verdict = judge_validity(leaf, now, args.warn_days)
    if verdict.reason is not None:
        if leaf.not_before <= now < leaf.not_after:
            print(f"tlsreload check: usable by the reloader, but {verdict.reason}", file=sys.stderr)
        else:  # the reloader's own rule (identity.judge_period): refused on reload, served at start with a warning
            print(
                f"tlsreload check: a running reloader refuses this pair ({verdict.reason}); "
                "a server starting with it serves it, with a warning",
                file=sys.stderr,
            )
    return verdict.status


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tlsreload`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "check" and (args.cert is None) == (args.directory is None):
        parser.error("check takes either --cert PATH (one certificate and key) or DIR (identities), not both")
    if args.command == "check":
        try:
            return run_check(args)
        except Exception as e:  # a bad input we did not foresee must still not end in a traceback
            print(f"tlsreload check: NOT USABLE: unexpected error: {type(e).__name__}: {e}", file=sys.stderr)
            return EXIT_UNUSABLE
    if args.command == "watch":
        return watch.run(args)
    return demo.run(server=args.server, rotations=args.rotations, interval=args.interval, timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())

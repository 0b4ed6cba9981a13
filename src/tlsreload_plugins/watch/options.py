"""The command line of ``tlsreload watch``, and the command line of the child it starts.

:func:`add_parser` adds ``watch`` to ``tlsreload``'s sub-commands; :func:`options_from` decodes and cross-checks
the parsed arguments into :class:`Options` (or raises :class:`UsageError`); :func:`configure_logging` sets up
watch's lines on stderr. For the child: :func:`rewrite_paths` points its arguments at watch's copies, and
:func:`is_granian` / :func:`granian_caveats` say what will go wrong with granian and the files given.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tlsreload_plugins.files import Password, TLSFiles, password_file
from tlsreload_plugins.settings import INTERVAL_ENV, resolve_interval
from tlsreload_plugins.watch.notify import ENV_CERTFILE, ENV_KEYFILE, ENV_SERIAL


class UsageError(Exception):
    """A command line or set-up that cannot work (exit status 2)."""


@dataclass
class Options:
    """Everything ``run`` needs, decoded from the command line."""

    files: TLSFiles
    password: Password
    interval: float | None
    sig: int
    pid: int | None
    pid_file: str | None
    exec_command: str | None
    command: list[str]
    copy_dir: str | None
    copy: bool


def parse_signal(value: str) -> int:
    """``HUP``, ``SIGHUP``, ``hup`` or ``1`` -> 1."""
    text = value.strip().upper()
    if text.isdigit():
        number = int(text)
        if 0 < number < signal.NSIG:
            return number
    else:
        name = text if text.startswith("SIG") else f"SIG{text}"
        with contextlib.suppress(KeyError):
            return int(signal.Signals[name])
    raise argparse.ArgumentTypeError(f"not a signal: {value!r} (try HUP, USR1, USR2 or a number)")


def _pid(value: str) -> int:
    if not value.isdigit() or int(value) <= 1:
        raise argparse.ArgumentTypeError(f"expected a process id > 1, got {value!r}")
    return int(value)


def _positive_seconds(value: str) -> float:
    try:
        return resolve_interval(float(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {value!r}") from None


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``watch`` to ``tlsreload``'s sub-commands (``commands`` is what ``add_subparsers`` returned)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "watch",
        help="validate rotations and signal a server whose TLS is not in Python (granian, nginx, ...)",
        description="Check the certificate files every --interval seconds; after each change to a complete, "
        "valid pair, signal the server (--pid, --pid-file), run a command (--exec), or signal the child given "
        "after '--'. A torn, mismatched or missing pair never reaches the server. With a child, watch serves it "
        "validated copies of the files and forwards TERM, INT, HUP and QUIT. Exit: the child's status (128+N "
        "when killed by signal N); 1 files unusable at start; 2 bad command line.",
        epilog="example: tlsreload watch --certfile tls.crt --keyfile tls.key -- "
        "granian --interface asgi --ssl-certificate tls.crt --ssl-keyfile tls.key app:app",
    )
    parser.add_argument("--certfile", required=True, metavar="PATH", help="certificate chain (PEM), leaf first")
    parser.add_argument("--keyfile", metavar="PATH", help="private key (PEM); omit when it is in --certfile")
    parser.add_argument("--ca-certs", metavar="PATH", help="client CA bundle (PEM) the server verifies clients with")
    parser.add_argument("--password-file", metavar="PATH", help="file whose first line is the key's password")
    parser.add_argument(
        "--interval",
        type=_positive_seconds,
        metavar="SECONDS",
        help=f"seconds between checks (default: ${INTERVAL_ENV}, else 1)",
    )
    parser.add_argument(
        "--signal", type=parse_signal, default=int(signal.SIGHUP), metavar="SIG", help="signal to send (default: HUP)"
    )
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--pid", type=_pid, metavar="PID", help="signal this process after each valid change")
    target.add_argument(
        "--pid-file", metavar="PATH", help="signal the process whose id is in PATH (read again every time)"
    )
    target.add_argument(
        "--exec",
        dest="exec_command",
        metavar="CMD",
        help=f"run this shell command after each valid change (e.g. 'nginx -s reload'); ${ENV_CERTFILE}, "
        f"${ENV_KEYFILE} and ${ENV_SERIAL} are set; a failure is logged",
    )
    copying = parser.add_mutually_exclusive_group()
    copying.add_argument(
        "--copy-dir",
        metavar="DIR",
        help="keep the last validated files in DIR (created 0700; files 0600, replaced atomically, kept at exit) "
        "and point the server there; with a child the default is a temporary directory removed at exit",
    )
    copying.add_argument(
        "--no-copy", action="store_true", help="let the child read the original files (see docs/watch.md)"
    )
    parser.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), default="info", help="default: info"
    )
    parser.add_argument("child", nargs="*", metavar="-- COMMAND", help="run COMMAND as the child")
    parser.set_defaults(watch_parser=parser)
    return parser


def options_from(args: argparse.Namespace) -> Options:
    """Decode and cross-check the parsed arguments; raises :class:`UsageError`."""
    command = list(args.child or [])
    targets = [args.pid is not None, args.pid_file is not None, args.exec_command is not None, bool(command)]
    if sum(targets) != 1:
        raise UsageError("say what to tell: --pid PID, --pid-file PATH, --exec CMD, or -- COMMAND (exactly one)")
    if args.no_copy and not command:
        raise UsageError("--no-copy is for the child form (-- COMMAND): without a child nothing is copied by default")
    password: Password = None
    if args.password_file:
        password = password_file(args.password_file)
    return Options(
        files=TLSFiles(args.certfile, args.keyfile or None, args.ca_certs or None),
        password=password,
        interval=args.interval,
        sig=args.signal,
        pid=args.pid,
        pid_file=args.pid_file,
        exec_command=args.exec_command,
        command=command,
        copy_dir=args.copy_dir,
        copy=bool(args.copy_dir) or (bool(command) and not args.no_copy),
    )


_LOG_FORMAT = "%(asctime)s [%(levelname)s] %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """tlsreload's lines on stderr, one per event, at ``level`` (the child's output is its own)."""
    package = logging.getLogger("tlsreload_plugins")
    if not package.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_LOG_FORMAT))
        package.addHandler(handler)
        package.propagate = False
    package.setLevel(level.upper())


# --- the child's command line ----------------------------------------------------------------------------


def rewrite_paths(command: Sequence[str], replacements: dict[str, str]) -> tuple[list[str], int]:
    """``command`` with every argument naming a watched file (``PATH`` or ``--opt=PATH``) pointed at its
    copy; returns the new command and how many arguments were rewritten. Paths are compared as absolute
    paths, without resolving symlinks (the user names the symlink)."""
    wanted = {os.path.abspath(original): copy for original, copy in replacements.items()}

    def replace(value: str) -> str | None:
        return wanted.get(os.path.abspath(value)) if value else None

    result = [command[0]]
    changed = 0
    for arg in command[1:]:
        new = replace(arg)
        if new is None and arg.startswith("-") and "=" in arg:
            option, _, value = arg.partition("=")
            copy = replace(value)
            new = f"{option}={copy}" if copy is not None else None
        if new is not None:
            changed += 1
        result.append(arg if new is None else new)
    return result, changed


def is_granian(command: Sequence[str]) -> bool:
    """Whether ``command`` starts granian (``granian ...`` or ``python -m granian ...``)."""
    if not command:
        return False
    if "granian" in os.path.basename(command[0]):
        return True
    return any(a == "-m" and b == "granian" for a, b in itertools.pairwise(command))


def granian_caveats(files: TLSFiles, copying: bool) -> list[str]:
    """What will go wrong with granian 2.8 and these files, as measured (see docs/watch.md)."""
    caveats = []
    if not copying:
        linked = [p for p in (files.certfile, files.keyfile, files.ca_certs) if p and _has_symlink(p)]
        if linked:
            caveats.append(
                f"granian resolves symlinks once, at start ({', '.join(linked)}): after a kubelet or certbot "
                "rotation its SIGHUP re-reads the old target (certbot) or a deleted one (kubelet: the new worker "
                "panics and granian exits). Drop --no-copy so granian reads watch's copies"
            )
    key_path = files.keyfile or files.certfile
    try:
        with open(key_path, "rb") as f:
            head = f.read(1024 * 1024)
    except OSError:
        return caveats
    if b"ENCRYPTED PRIVATE KEY-----" in head or b"Proc-Type: 4,ENCRYPTED" in head:
        caveats.append(
            f"key file {key_path} is encrypted: granian 2.8 panics on encrypted keys ('Invalid key'), with or "
            "without --ssl-keyfile-password; give granian an unencrypted key (PKCS#8, 0600)"
        )
    return caveats


def _has_symlink(path: str) -> bool:
    return os.path.realpath(path) != os.path.abspath(path)

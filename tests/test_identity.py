"""Unit tests of the decision "is what is on disk usable?": read_files, validate, fingerprint, and
Reloader.check's settle-report-recover cycle for every kind of bad input. Real files, real keys."""

from __future__ import annotations

import logging
import os
import ssl
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from tls_server import make_recipe
from tlsreload_plugins import InvalidIdentity, Outcome, Reloader, TLSFiles
from tlsreload_plugins.files import fingerprint, read_files
from tlsreload_plugins.identity import validate
from tlstest import PASSWORD, Pair, issue, obey_file_modes, with_password

WRONG = "Tr0ub4dor"


def encrypted(key_pem: bytes, password: str, traditional: bool = False) -> bytes:
    return with_password(Pair(b"", key_pem, ""), password, traditional).key


@dataclass
class Dir:
    """A server's TLS directory: certificate, key and client-CA bundle."""

    path: Path
    ca: trustme.CA

    @property
    def files(self) -> TLSFiles:
        return TLSFiles(str(self.cert), str(self.key), str(self.client_ca))

    @property
    def cert(self) -> Path:
        return self.path / "tls.crt"

    @property
    def key(self) -> Path:
        return self.path / "tls.key"

    @property
    def client_ca(self) -> Path:
        return self.path / "ca.crt"

    def write(self, pair: Pair, key: bytes | None = None) -> None:
        self.cert.write_bytes(pair.chain)
        self.key.write_bytes(pair.key if key is None else key)


@pytest.fixture
def tls_dir(tmp_path: Path, ca: trustme.CA) -> Dir:
    d = Dir(tmp_path, ca)
    d.write(issue(ca))
    d.client_ca.write_bytes(trustme.CA().cert_pem.bytes())
    return d


@dataclass
class Bad:
    """One way the files go wrong: how to write it, the words the reason must contain, the file it must name."""

    breaks: Callable[[Dir], object]
    reason: str
    names: str  # "cert", "key" or "client_ca"
    password: str | None = None  # the password the server is configured with


def _truncated_chain(d: Dir) -> None:
    pair = issue(d.ca.create_child_ca())  # leaf + intermediate: the cut falls inside the second certificate
    d.write(pair)
    d.cert.write_bytes(pair.chain[:-100])


def _unlink(path: Path) -> None:
    path.unlink()


def _make_dir(path: Path) -> None:
    path.unlink()
    path.mkdir()


BAD: dict[str, Bad] = {
    "mismatched key": Bad(lambda d: d.write(issue(d.ca), key=issue(d.ca).key), "does not match the certificate", "key"),
    "garbage certificate": Bad(
        lambda d: d.cert.write_bytes(b"this is not a certificate\n"), "holds no PEM certificate", "cert"
    ),
    "corrupt PEM certificate": Bad(
        lambda d: d.cert.write_bytes(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
        "cannot be parsed",
        "cert",
    ),
    "truncated certificate": Bad(
        lambda d: d.cert.write_bytes((p := issue(d.ca)).chain[: len(p.chain) // 2]), "truncated", "cert"
    ),
    "truncated chain": Bad(
        _truncated_chain,
        "truncated: 2 certificates begin but 1 are complete",
        "cert",
    ),
    "empty certificate": Bad(lambda d: d.cert.write_bytes(b""), "is empty", "cert"),
    "empty key": Bad(lambda d: d.key.write_bytes(b""), "is empty", "key"),
    "blank key": Bad(lambda d: d.key.write_bytes(b"\n\n"), "is empty", "key"),
    "key file given as certificate": Bad(
        lambda d: d.cert.write_bytes(d.key.read_bytes()), "holds a private key, not a certificate", "cert"
    ),
    "certificate given as key": Bad(
        lambda d: d.key.write_bytes(d.cert.read_bytes()), "holds a certificate, not a private key", "key"
    ),
    "truncated key": Bad(lambda d: d.key.write_bytes(d.key.read_bytes()[:-40]), "no end marker", "key"),
    "corrupt key": Bad(
        lambda d: d.key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
        "cannot be parsed",
        "key",
    ),
    "encrypted key, wrong password": Bad(
        lambda d: d.write(p := issue(d.ca), key=encrypted(p.key, WRONG)), "wrong password", "key", PASSWORD
    ),
    "encrypted key, wrong password, traditional": Bad(
        lambda d: d.write(p := issue(d.ca), key=encrypted(p.key, WRONG, traditional=True)),
        "wrong password",
        "key",
        PASSWORD,
    ),
    "encrypted key, no password": Bad(
        lambda d: d.write(p := issue(d.ca), key=encrypted(p.key, PASSWORD)), "no password is configured", "key"
    ),
    "missing certificate": Bad(lambda d: _unlink(d.cert), "does not exist", "cert"),
    "missing key": Bad(lambda d: _unlink(d.key), "does not exist", "key"),
    "missing client CA": Bad(lambda d: _unlink(d.client_ca), "does not exist", "client_ca"),
    "garbage client CA": Bad(lambda d: d.client_ca.write_bytes(b"junk\n"), "holds no PEM certificate", "client_ca"),
    "directory instead of certificate": Bad(lambda d: _make_dir(d.cert), "is a directory, not a regular file", "cert"),
    "directory instead of key": Bad(lambda d: _make_dir(d.key), "is a directory, not a regular file", "key"),
}


def _good_start(d: Dir, bad: Bad) -> None:
    # The server starts from a valid identity with the password it is configured with.
    pair = issue(d.ca)
    d.write(pair, key=encrypted(pair.key, bad.password) if bad.password else None)


@pytest.mark.parametrize("case", list(BAD))
def test_validate_names_the_file_and_the_reason(tls_dir: Dir, case: str) -> None:
    bad = BAD[case]
    _good_start(tls_dir, bad)
    validate(read_files(tls_dir.files), bad.password)
    bad.breaks(tls_dir)
    with pytest.raises(InvalidIdentity) as error:
        validate(read_files(tls_dir.files), bad.password)
    message = str(error.value)
    assert bad.reason in message
    assert str(getattr(tls_dir, bad.names)) in message
    assert "\n" not in message
    assert PASSWORD not in message and WRONG not in message, "never a password in a message"


@pytest.mark.parametrize("case", list(BAD))
def test_check_settles_reports_once_keeps_serving_and_recovers(
    tls_dir: Dir, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tlsreload_plugins")
    bad = BAD[case]
    _good_start(tls_dir, bad)
    files = tls_dir.files
    recipe = make_recipe(files.certfile, files.keyfile, files.ca_certs, bad.password)
    reloader = Reloader(files.certfile, files.keyfile, recipe=recipe, ca_certs=files.ca_certs, password=bad.password)
    serving = reloader.leaf
    bad.breaks(tls_dir)

    outcomes = [reloader.check() for _ in range(6)]
    assert outcomes == [Outcome.PENDING, *[Outcome.FAILED] * 5], "seen twice, then reported, then quiet"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert bad.reason in warnings[0] and f"still serving serial {serving.serial}" in warnings[0]
    status = reloader.status()
    assert status.failures == 1 and status.reloads == 0 and status.leaf == serving
    assert status.last_error is not None and bad.reason in status.last_error

    if tls_dir.cert.is_dir():
        tls_dir.cert.rmdir()
    if tls_dir.key.is_dir():
        tls_dir.key.rmdir()
    tls_dir.client_ca.write_bytes(trustme.CA().cert_pem.bytes())
    fixed = issue(tls_dir.ca)
    tls_dir.write(fixed, key=encrypted(fixed.key, bad.password) if bad.password else None)
    assert reloader.check() is Outcome.RELOADED
    assert reloader.leaf.serial == fixed.serial
    assert reloader.status().last_error is None
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("usable again" in m for m in infos) and any("reloaded TLS certificate" in m for m in infos)


def test_settle_false_reports_at_once(tls_dir: Dir) -> None:
    reloader = Reloader(str(tls_dir.cert), str(tls_dir.key), recipe=make_recipe(str(tls_dir.cert), str(tls_dir.key)))
    tls_dir.key.unlink()
    assert reloader.check(settle=False) is Outcome.FAILED
    assert reloader.status().failures == 1


def test_a_torn_write_seen_once_is_not_a_failure(tls_dir: Dir) -> None:
    """Rotations write the certificate and the key at different moments: one odd look is not reported."""
    reloader = Reloader(str(tls_dir.cert), str(tls_dir.key), recipe=make_recipe(str(tls_dir.cert), str(tls_dir.key)))
    new = issue(tls_dir.ca)
    tls_dir.cert.write_bytes(new.chain)  # the certificate has landed, the key not yet
    assert reloader.check() is Outcome.PENDING
    tls_dir.key.write_bytes(new.key)
    assert reloader.check() is Outcome.RELOADED
    assert reloader.status().failures == 0 and reloader.leaf.serial == new.serial


def test_a_different_bad_content_each_check_is_not_reported_until_it_holds(tls_dir: Dir) -> None:
    reloader = Reloader(str(tls_dir.cert), str(tls_dir.key), recipe=make_recipe(str(tls_dir.cert), str(tls_dir.key)))
    for _ in range(3):
        tls_dir.key.write_bytes(issue(tls_dir.ca).key)  # a new mismatch every time: still moving
        assert reloader.check() is Outcome.PENDING
    assert reloader.check() is Outcome.FAILED
    assert reloader.status().failures == 1


def test_restoring_the_served_files_clears_the_error(tls_dir: Dir, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tlsreload_plugins")
    reloader = Reloader(str(tls_dir.cert), str(tls_dir.key), recipe=make_recipe(str(tls_dir.cert), str(tls_dir.key)))
    good_key = tls_dir.key.read_bytes()
    tls_dir.key.unlink()
    assert reloader.check(settle=False) is Outcome.FAILED
    tls_dir.key.write_bytes(good_key)
    assert reloader.check() is Outcome.UNCHANGED
    assert reloader.status().last_error is None and reloader.status().reloads == 0
    assert any("usable again" in r.getMessage() for r in caplog.records)


def test_unreadable_file(tls_dir: Dir) -> None:
    """chmod 000: root ignores it, so the reading happens in a process bound by file modes."""
    tls_dir.key.chmod(0)
    probe = (
        "import sys\n"
        "from tlsreload_plugins.errors import InvalidIdentity\n"
        "from tlsreload_plugins.files import TLSFiles, read_files\n"
        "try:\n"
        "    read_files(TLSFiles(sys.argv[1], sys.argv[2]))\n"
        "except InvalidIdentity as e:\n"
        "    print(e)\n"
    )
    script = tls_dir.path / "probe.py"
    script.write_text(probe)
    result = subprocess.run(
        [*obey_file_modes(), str(script), str(tls_dir.cert), str(tls_dir.key)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == f"key file {tls_dir.key} cannot be read: permission denied", result.stderr


@pytest.mark.parametrize("password", [PASSWORD, PASSWORD.encode(), lambda: PASSWORD])
@pytest.mark.parametrize("traditional", [False, True])
def test_encrypted_key_with_the_right_password(
    tls_dir: Dir, password: str | bytes | Callable[[], str], traditional: bool
) -> None:
    pair = issue(tls_dir.ca)
    tls_dir.write(pair, key=encrypted(pair.key, PASSWORD, traditional))
    assert validate(read_files(tls_dir.files), password).serial == pair.serial


# A throwaway P-256 key encrypted with the password "right". Decrypted with "wrong", it happens to give
# bytes with valid padding, so cryptography says "Could not deserialize key data", not "Incorrect password".
# Measured: 11 wrong-password attempts in 3,000 end this way.
UNLUCKY_KEY = b"""-----BEGIN ENCRYPTED PRIVATE KEY-----
MIH0MF8GCSqGSIb3DQEFDTBSMDEGCSqGSIb3DQEFDDAkBBD/ZLQRjODRIgsphGZU
tR+ZAgIIADAMBggqhkiG9w0CCQUAMB0GCWCGSAFlAwQBKgQQNSlxo6skG3ch/PjK
61nAJASBkMTfUufu9rS5coGwGpqkKbYxSpKRhm+9Tw0bJZhm6eD0hm15lHzSM4Rp
Wm03Hlkt66WDAjZGIOWcIHPLNdpUQfe0uoI7PZzS9ac0Ec3IyzjqEPsuLJ07TYzq
hEkl2eV08KLFx1Va146KruXFYyO0Z8/w8SWA1uOyURG4wcgc+Rj5YR3brKzcGZrg
Th7gdCXhMA==
-----END ENCRYPTED PRIVATE KEY-----
"""


def test_a_wrong_password_is_named_even_when_decryption_yields_garbage(tls_dir: Dir) -> None:
    tls_dir.key.write_bytes(UNLUCKY_KEY)
    with pytest.raises(InvalidIdentity, match="does not match"):  # the right password: the key itself is fine
        validate(read_files(tls_dir.files), "right")
    with pytest.raises(InvalidIdentity, match="wrong password for key file"):
        validate(read_files(tls_dir.files), "wrong")


def test_a_password_for_a_plain_key_is_accepted_as_ssl_does(tls_dir: Dir) -> None:
    pair = issue(tls_dir.ca)
    tls_dir.write(pair)
    assert validate(read_files(tls_dir.files), "unused").serial == pair.serial
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(tls_dir.cert, tls_dir.key, "unused")


def test_key_in_the_certificate_file(tls_dir: Dir) -> None:
    pair = issue(tls_dir.ca)
    tls_dir.cert.write_bytes(pair.chain + pair.key)
    assert validate(read_files(TLSFiles(str(tls_dir.cert)))).serial == pair.serial


def test_no_key_anywhere_is_said_plainly(tls_dir: Dir) -> None:
    """No key file configured and none in the certificate file: not "are the paths swapped?"."""
    with pytest.raises(InvalidIdentity) as error:
        validate(read_files(TLSFiles(str(tls_dir.cert))))
    assert str(error.value) == f"certificate file {tls_dir.cert} holds no private key, and no key file is configured"


@pytest.mark.parametrize("key_type", [trustme.KeyType.ECDSA, trustme.KeyType.RSA])
def test_leaf_summary(tls_dir: Dir, key_type: trustme.KeyType) -> None:
    ca = trustme.CA(key_type=key_type)
    pair = issue(ca.create_child_ca(key_type=key_type), "example.test", "10.0.0.1", key_type=key_type)
    tls_dir.write(pair)
    leaf = validate(read_files(tls_dir.files))
    assert leaf.serial == pair.serial
    assert leaf.sans == ("example.test", "10.0.0.1")
    assert leaf.not_before < leaf.not_after
    assert pair.serial in leaf.describe() and "example.test" in leaf.describe()


def test_an_rsa_key_for_an_ecdsa_certificate_does_not_match(tls_dir: Dir) -> None:
    tls_dir.write(issue(tls_dir.ca), key=issue(trustme.CA(key_type=trustme.KeyType.RSA)).key)
    with pytest.raises(InvalidIdentity, match="does not match"):
        validate(read_files(tls_dir.files))


def test_fingerprint_follows_content_not_metadata(tls_dir: Dir) -> None:
    before = fingerprint(read_files(tls_dir.files))
    for path in (tls_dir.cert, tls_dir.key):
        path.chmod(0o600)
        os.utime(path, (0, 0))
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data)  # a new inode, same bytes
    assert fingerprint(read_files(tls_dir.files)) == before
    tls_dir.client_ca.write_bytes(tls_dir.client_ca.read_bytes() + b"\n")
    assert fingerprint(read_files(tls_dir.files)) != before, "one byte more in any file is a change"


def test_fingerprint_tells_which_file_holds_which_bytes(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"ab")
    (tmp_path / "b").write_bytes(b"c")
    (tmp_path / "c").write_bytes(b"a")
    (tmp_path / "d").write_bytes(b"bc")
    one = fingerprint(read_files(TLSFiles(str(tmp_path / "a"), str(tmp_path / "b"))))
    other = fingerprint(read_files(TLSFiles(str(tmp_path / "c"), str(tmp_path / "d"))))
    assert one != other


def test_start_up_with_bad_files_raises_one_clear_error(tls_dir: Dir) -> None:
    tls_dir.key.write_bytes(issue(tls_dir.ca).key)
    with pytest.raises(InvalidIdentity, match="does not match the certificate") as error:
        Reloader(str(tls_dir.cert), str(tls_dir.key), recipe=make_recipe(str(tls_dir.cert), str(tls_dir.key)))
    assert str(tls_dir.key) in str(error.value)


def test_recipe_errors_become_invalid_identity(tls_dir: Dir) -> None:
    """Files that validate but that the recipe cannot load (here: it loads another, broken, path)."""
    broken = tls_dir.path / "elsewhere.pem"
    broken.write_bytes(b"junk")
    with pytest.raises(InvalidIdentity, match="could not be built"):
        Reloader(str(tls_dir.cert), str(tls_dir.key), recipe=make_recipe(str(broken), str(tls_dir.key)))


def test_a_recipe_that_returns_no_context_is_a_type_error(tls_dir: Dir) -> None:
    with pytest.raises(TypeError, match=r"not ssl\.SSLContext"):
        Reloader(str(tls_dir.cert), str(tls_dir.key), recipe=lambda: None)  # type: ignore[arg-type,return-value]


def test_python_obeying_file_modes_really_does(tmp_path: Path) -> None:
    """The helper the unreadable-file tests rely on: without it, as root, they would prove nothing."""
    secret = tmp_path / "secret"
    secret.write_text("x")
    secret.chmod(0)
    code = "import sys\ntry:\n    open(sys.argv[1])\nexcept PermissionError:\n    print('denied')\n"
    result = subprocess.run(
        [*obey_file_modes(), "-c", code, str(secret)], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "denied", (result.stdout, result.stderr, sys.executable)

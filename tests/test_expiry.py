"""Short-lived identities said right (:mod:`tlsreload_plugins.expiry`): the warning window is a share of the
identity's lifetime unless set; "EXPIRED" is said at ERROR the moment the identity served has expired, whatever was
warned before, and again while it is still served; the words use the scale of what is left and say where the next
identity should come from. The decisions called directly, then a certificate of a minute's life in files served by
gunicorn's two workers (each says it), and an SVID of a minute's life from the Workload API.
"""

from __future__ import annotations

import datetime
import logging
import re
import ssl
from pathlib import Path

import pytest
import trustme
from cryptography import x509

from test_gunicorn import DROP_IN, fetch, gunicorn, start
from tlsreload_plugins.client import ClientIdentity
from tlsreload_plugins.expiry import duration, expiry_notice, warn_expiry, warning_seconds
from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.identity import Leaf, leaf_info
from tlsreload_plugins.sources.spiffe import SpiffeSource
from tlstest import KubeletLayout, Pair, free_port, issue, wait_until
from workload_api_server import WorkloadAPI, mint_svid

DAY = 86400.0


def now_utc() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def leaf(ca: trustme.CA, lifetime: datetime.timedelta, left: datetime.timedelta) -> Leaf:
    """A certificate of ``lifetime`` that ends ``left`` from now, as the reloaders describe it."""
    end = now_utc() + left
    pair = issue(ca, not_before=end - lifetime, not_after=end)
    return leaf_info(x509.load_pem_x509_certificate(pair.chain))


def test_the_warning_window_is_a_share_of_the_lifetime_unless_set(ca: trustme.CA) -> None:
    hour, days = datetime.timedelta(hours=1), datetime.timedelta(days=1)
    assert warning_seconds(leaf(ca, hour, hour), None) == pytest.approx(600, abs=1)  # an SVID: 10 minutes
    assert warning_seconds(leaf(ca, 6 * days, days), None) == pytest.approx(DAY, abs=1)  # a 6-day certificate
    assert warning_seconds(leaf(ca, 90 * days, days), None) == 14 * DAY  # months: at most the 14 days of old
    assert warning_seconds(leaf(ca, hour, hour), 2.0) == 2 * DAY  # set: as set


def test_expired_is_said_the_moment_it_is_whatever_was_warned_and_again_while_served(ca: trustme.CA) -> None:
    minute = leaf(ca, datetime.timedelta(minutes=1), datetime.timedelta(seconds=30))
    end, interval = minute.not_after.timestamp(), 0.5
    said: list[tuple[float, bool]] = []
    last = None
    for offset in (-20, -9, -5, 0.1, 0.3, 0.6, 1.0, 1.7, 2.0, 3.7, 7.7, 9.0, 15.7):
        last, say = expiry_notice(minute, end + offset, None, last, interval)
        if say:
            assert last is not None
            said.append((offset, last.expired))
    # 20 s left: outside the last sixth (10 s); 9 s left: warned once; expired: said at once, though warned 9 s
    # before, then an interval later, then at doubling gaps.
    assert said == [(-9, False), (0.1, True), (0.6, True), (1.7, True), (3.7, True), (7.7, True), (15.7, True)]
    renewed = leaf(ca, datetime.timedelta(minutes=1), datetime.timedelta(seconds=-1))  # another serial, expired
    assert expiry_notice(renewed, end + 16, None, last, interval)[1]  # what was said of the other counts for nothing


def test_the_words_use_the_scale_and_say_where_the_next_comes_from(
    ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    assert [duration(s) for s in (45, 540, 5.2 * 3600, 3.1 * DAY)] == ["45 s", "9 min", "5.2 hours", "3.1 days"]
    log = logging.getLogger("tlsreload_plugins.test")
    soon = leaf(ca, datetime.timedelta(hours=1), datetime.timedelta(minutes=9))
    gone = leaf(ca, datetime.timedelta(hours=1), datetime.timedelta(seconds=-45))
    files = TLSFiles("/etc/tls/tls.crt", "/etc/tls/tls.key")
    svid = TLSFiles("/dev/shm/tlsreload-spiffe-1.2.3-x/tls.crt", "/dev/shm/tlsreload-spiffe-1.2.3-x/tls.key")
    with caplog.at_level(logging.WARNING, logger="tlsreload_plugins.test"):
        now = soon.not_after.timestamp() - 540
        warn_expiry(log, soon, files, now, None, None, interval=1.0)
        warn_expiry(log, gone, svid, gone.not_after.timestamp() + 45, None, None, interval=1.0, what="the client cert")
    (warning, error) = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert warning[0] == logging.WARNING and "the served certificate expires in 9 min" in warning[1]
    assert "no newer valid one is in /etc/tls yet" in warning[1] and soon.serial in warning[1]
    assert error[0] == logging.ERROR and "the client cert EXPIRED 45 s ago" in error[1]
    assert "no newer SVID has come from the Workload API" in error[1] and "days" not in error[1]


def unverified() -> ssl.SSLContext:
    """A client that takes any certificate, expired included: to see which worker answers, after the end too."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def test_a_minute_long_certificate_every_gunicorn_worker_says_it_expired(tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    end = now_utc() + datetime.timedelta(seconds=3)
    short: Pair = issue(ca, not_before=end - datetime.timedelta(minutes=1), not_after=end)
    layout.install(short)
    port = free_port()
    with start(gunicorn(port, layout.cert_path, layout.key_path, "-c", DROP_IN), tmp_path) as server:
        pids: set[int] = set()

        def both_workers() -> bool:
            pids.update(pid for _, pid in (fetch(port, unverified()) for _ in range(6)))
            return len(pids) >= 2

        wait_until(both_workers, 30, what="both workers answering")

        def expired_lines(pid: int) -> list[str]:
            pattern = re.compile(rf"\[{pid}\] \[ERROR\] .*the served certificate EXPIRED (\d+ s|\d+ min) ago")
            return [line for line in server.output().splitlines() if pattern.search(line)]

        # Each worker says it, at ERROR, at its first check after the end, and again an interval later.
        wait_until(lambda: all(len(expired_lines(pid)) >= 2 for pid in pids), 30, what="EXPIRED twice per worker")
        output = server.output()
        assert short.serial in expired_lines(min(pids))[0] and str(layout.cert_path.parent) in output
        assert "0.0 days" not in output and not re.search(r"\[WARNING\] .*EXPIRED", output), output


def test_an_svid_of_a_minutes_life_says_it_expires_then_expired_naming_the_workload_api(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tlsreload_plugins")
    end = now_utc() + datetime.timedelta(seconds=3)
    svid = mint_svid(ca, "web", "localhost", not_before=end - datetime.timedelta(minutes=1), not_after=end)
    api = WorkloadAPI(tmp_path)
    api.send([svid])
    with api, SpiffeSource(api.endpoint, timeout=30) as source:
        identity = ClientIdentity.from_files(source.files, interval=0.2)  # the agent sends nothing newer
        with identity:

            def said(level: int, text: str) -> list[str]:
                return [r.getMessage() for r in caplog.records if r.levelno == level and text in r.getMessage()]

            wait_until(lambda: len(said(logging.ERROR, "EXPIRED")) >= 2, 30, what="EXPIRED said, then again")
    warned = said(logging.WARNING, "expires in")
    assert len(warned) == 1 and re.search(r"expires in \d s ", warned[0]), warned  # said when loaded, in seconds
    for line in (*warned, *said(logging.ERROR, "EXPIRED")):
        assert "no newer SVID has come from the Workload API" in line and "the client certificate presented" in line

"""The package's records (:class:`~tlsreload_plugins.frozen.FrozenRecord`): what their users rely on of the
NamedTuples and data classes they replace, and a contract every record keeps (fields in the order ``__init__``
takes them), checked on all of them."""

from __future__ import annotations

import copy
import importlib
import inspect
import pickle
import pkgutil
from datetime import datetime, timezone

import pytest

import tlsreload_plugins
from tlsreload_plugins.files import Snapshot, TLSFiles
from tlsreload_plugins.frozen import FrozenRecord
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.outcome import Status


def all_records() -> list[type[FrozenRecord]]:
    """Every record class the package defines (its modules imported, extras not installed skipped)."""
    for info in pkgutil.walk_packages(tlsreload_plugins.__path__, "tlsreload_plugins."):
        if info.name.endswith("__main__"):  # runs the command line
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:
            continue
    found: list[type[FrozenRecord]] = []
    pending = list(FrozenRecord.__subclasses__())
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def test_every_record_takes_its_fields_in_order_and_keeps_no_dict() -> None:
    records = all_records()
    assert {"TLSFiles", "Snapshot", "Leaf", "Status", "Settings"} <= {cls.__name__ for cls in records}
    for cls in records:
        parameters = list(inspect.signature(cls.__init__).parameters)[1:]
        assert tuple(parameters) == cls._fields, cls
        assert cls.__slots__ == cls._fields, cls
        assert "__dict__" not in dir(cls), cls


def leaf() -> Leaf:
    when = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return Leaf("CN=a", "01", ("a.example",), when, when, "ab" * 32)


def test_a_record_reads_compares_hashes_and_shows_by_its_fields() -> None:
    files = TLSFiles("c.pem", keyfile="k.pem")
    assert (files.certfile, files.keyfile, files.ca_certs, files.crl) == ("c.pem", "k.pem", None, None)
    assert files == TLSFiles("c.pem", "k.pem", None, None)
    assert files != TLSFiles("c.pem")
    assert files != Snapshot(files, b"", None, None)  # another class, even with a field in common
    assert len({files, TLSFiles("c.pem", "k.pem"), TLSFiles("c.pem")}) == 2
    assert repr(files) == "TLSFiles(certfile='c.pem', keyfile='k.pem', ca_certs=None, crl=None)"


def test_a_record_is_read_only_and_changed_by_replace() -> None:
    files = TLSFiles("c.pem")
    with pytest.raises(AttributeError, match="read-only"):
        files.certfile = "other.pem"  # type: ignore[misc]
    with pytest.raises(AttributeError, match="read-only"):
        del files.keyfile
    with pytest.raises(AttributeError):
        files.other = 1  # type: ignore[attr-defined]
    assert files._replace(crl="crl.pem") == TLSFiles("c.pem", crl="crl.pem")
    assert files == TLSFiles("c.pem")
    with pytest.raises(TypeError):
        files._replace(nonsense=1)


def test_a_record_pickles_copies_and_converts_to_a_dict() -> None:
    status = Status(TLSFiles("c.pem"), 1.0, leaf(), 10.0, None, None, 3, 1, 0)
    for copied in (pickle.loads(pickle.dumps(status)), copy.copy(status), copy.deepcopy(status)):
        assert copied == status
        assert copied.refused_resumptions == 0
    fields = status._asdict()
    assert list(fields) == list(Status._fields)
    assert fields["leaf"] == leaf() and fields["checks"] == 3

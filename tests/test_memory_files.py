"""Contexts built from bytes in memory (:mod:`tlsreload_plugins.memory_files`): how a published identity, and an SNI
identity built on its first handshake, are served. A real context, a real handshake."""

from __future__ import annotations

import os
import ssl
import tempfile

import trustme

from tls_server import make_recipe, serving
from tlsreload_plugins import TLSFiles
from tlsreload_plugins.memory_files import in_memory_files
from tlstest import client_context, issue, served_serial


def recipe_for(files: TLSFiles) -> ssl.SSLContext:
    return make_recipe(files.certfile, files.keyfile, files.ca_certs)()


def test_in_memory_files_build_a_context_and_leave_nothing_on_disk(ca: trustme.CA) -> None:
    pair = issue(ca)
    before = set(os.listdir(tempfile.gettempdir()))
    with in_memory_files(pair.chain, pair.key, None) as files:
        context = recipe_for(files)
        assert files.certfile.startswith("/proc/self/fd/")
    assert set(os.listdir(tempfile.gettempdir())) == before
    with serving(context) as port:
        assert served_serial(port, client_context(ca)) == pair.serial

"""Each server's glue, one module each, on the core (:mod:`tlsreload_plugins.serving.start` and below).

A glue module says only what is particular to its server: how it is configured, where its context
is built, and its worker lifecycle; it imports no other server's glue. ``tlsreload_plugins.gunicorn``,
``.uvicorn`` and the other per-server names are the same modules under their documented names. See
docs/architecture.md.
"""

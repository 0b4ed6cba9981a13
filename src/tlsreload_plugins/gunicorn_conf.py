"""Drop-in gunicorn configuration that reloads the TLS certificate in every worker (see docs/gunicorn.md)::

    gunicorn -c python:tlsreload_plugins.gunicorn_conf --certfile tls.crt --keyfile tls.key app:app

The configuration gunicorn would read without this ``-c`` still applies, reloading added to its hooks."""

from tlsreload_plugins.servers.gunicorn import drop_in_settings as _drop_in_settings

globals().update(_drop_in_settings(__name__))

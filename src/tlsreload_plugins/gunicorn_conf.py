"""Drop-in gunicorn configuration that reloads the TLS certificate in every worker::

    gunicorn -c python:tlsreload_plugins.gunicorn_conf --certfile tls.crt --keyfile tls.key app:app

The files are checked every ``$TLSRELOAD_INTERVAL`` seconds (default 1). With a configuration
file of your own, add ``add_reload(globals())`` at its end instead (see
:mod:`tlsreload_plugins.gunicorn`).
"""

from tlsreload_plugins.gunicorn import add_reload

add_reload(globals())

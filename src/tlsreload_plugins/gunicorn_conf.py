"""Drop-in gunicorn configuration that reloads the TLS certificate in every worker::

    gunicorn -c python:tlsreload_plugins.gunicorn_conf --certfile tls.crt --keyfile tls.key app:app

Your own configuration still applies: the one gunicorn would have read without this ``-c``
(``./gunicorn.conf.py``, or the ``-c`` of ``$GUNICORN_CMD_ARGS``) is read here, as gunicorn
reads it, and reloading is added to its hooks; ``$GUNICORN_CMD_ARGS`` and the command line
then apply over it as usual. The files are checked every ``$TLSRELOAD_INTERVAL`` seconds
(default 1). See :mod:`tlsreload_plugins.servers.gunicorn`.
"""

from tlsreload_plugins.servers.gunicorn import drop_in_settings as _drop_in_settings

globals().update(_drop_in_settings(__name__))

"""An application's own gunicorn configuration, with certificate reloading added by two lines.

    gunicorn -c examples/gunicorn.conf.py --certfile /etc/letsencrypt/live/example.com/fullchain.pem \
        --keyfile /etc/letsencrypt/live/example.com/privkey.pem app:app

Everything above ``reloading(globals())`` is the application's own: its ``ssl_context`` hook
(TLS 1.3 only) is applied again on every reload, and its ``post_fork``, ``post_worker_init``
and ``worker_exit`` hooks still run in every worker.
"""

import ssl

from tlsreload_plugins.gunicorn import reloading

workers = 2
worker_class = "gthread"
threads = 4


def ssl_context(conf, default_ssl_context_factory):
    context = default_ssl_context_factory()
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    return context


def post_fork(server, worker):
    server.log.info("app hook: post_fork in worker %s", worker.pid)


def post_worker_init(worker):
    worker.log.info("app hook: post_worker_init in worker %s", worker.pid)


def worker_exit(server, worker):
    server.log.info("app hook: worker_exit in worker %s", worker.pid)


# Last: wraps the hooks above so that every worker reloads its certificate when the files change.
reloading(globals())

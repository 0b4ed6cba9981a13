"""What every server's glue does the same way: check at start and make the reloader (:mod:`.start`), a server's
worker processes (:mod:`.workers`), servers configured by an object (:mod:`.configured`) or through hooks
(:mod:`.hooks`), a drop-in command's ``--tls-*`` options (:mod:`.options`), checks for as long as an ASGI lifespan
runs (:mod:`.lifespan`), and the package's log lines in the server's log (:mod:`.logs`)."""

from tlsreload_plugins.serving.start import CannotServe, Settings, check_at_start, exit_if_cannot_serve, start_reloader

__all__ = ["CannotServe", "Settings", "check_at_start", "exit_if_cannot_serve", "start_reloader"]

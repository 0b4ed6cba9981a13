"""``tlsreload watch``: validated reloads for servers whose TLS is not in Python (granian, nginx, haproxy). The
command (:mod:`.command`) signals the server or runs a command (:mod:`.notify`) only when a new pair is complete
and valid; its options (:mod:`.options`); the validated copies a server can be pointed at (:mod:`.copies`)."""

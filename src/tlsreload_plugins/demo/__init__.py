"""``tlsreload demo``: a throwaway CA (:mod:`.certs`), a real gunicorn or uvicorn server serving :mod:`.app`
with reload on, three rotations written the way kubelet writes them, and what a client sees after each
(:mod:`.run`)."""

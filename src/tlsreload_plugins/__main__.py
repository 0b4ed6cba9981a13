"""``python -m tlsreload_plugins`` is the ``tlsreload`` command."""

from .cli import main

raise SystemExit(main())

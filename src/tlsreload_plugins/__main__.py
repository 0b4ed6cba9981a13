"""``python -m tlsreload_plugins`` is the ``tlsreload`` command."""

from tlsreload_plugins.cli import main

raise SystemExit(main())

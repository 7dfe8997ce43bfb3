"""``python -m store.server``: what ``eventide store serve`` and :func:`store.server.child` run."""

import sys

from store.server.process import main

sys.exit(main())

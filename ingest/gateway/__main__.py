"""``python -m ingest.gateway [--config FILE]``: the gateway in the foreground (how the launcher starts it)."""

import sys

from ingest.gateway.app import main

sys.exit(main())

"""``python -m rewindfs.overlay.cli`` — the same as the ``rewindfs`` command."""

import sys

from rewindfs.overlay.cli import main

sys.exit(main())

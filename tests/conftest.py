"""Shared fixtures.  Store fixtures end with the store's own consistency check."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from store_fixtures import assert_sound, store, store_path, ws  # noqa: E402,F401

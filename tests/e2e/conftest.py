"""The e2e folder's helpers import each other by module name."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

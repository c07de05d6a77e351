"""Make ``framework_helpers`` (tiny encoders, a recording loss, a training driver) importable from every test here."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

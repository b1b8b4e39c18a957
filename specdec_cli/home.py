"""$SPECDEC_HOME: the folder where specdec keeps what it makes once and reuses, ~/.cache/specdec by default.

Under it: converted models (`models/`), verify-cost curves and dtype and weights verdicts (`costs/`), block
weights (`weights/`), the answer memory (`memory/`) and distilled drafters (`drafts/`). This file names the
folder only; each of those is written by its own module.
"""

from __future__ import annotations

import os
from pathlib import Path


def specdec_home() -> Path:
    return Path(os.environ.get("SPECDEC_HOME") or Path.home() / ".cache" / "specdec").expanduser()

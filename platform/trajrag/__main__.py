"""``python -m trajrag ...``: the ``trajrag`` command, for a Python whose scripts are not on PATH
(a notebook's kernel runs commands this way)."""

import sys

from trajrag.cli import main

sys.exit(main())

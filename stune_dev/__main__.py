"""`python -m stune_dev`: the dev cluster's command line (`stune-devcluster`, which scripts/setup.sh puts
into a checkout's .venv/bin; stune_dev is not in the wheel)."""

import sys

from .devcluster import main

sys.exit(main())

"""`python -m helmgr.cli`: the same as the `helmgr` command."""
import sys

from helmgr.cli import main

sys.exit(main())

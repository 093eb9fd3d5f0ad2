"""`python -m helmgr.cli`: the same as the `helmgr` command."""
from helmgr.cli import main

main()

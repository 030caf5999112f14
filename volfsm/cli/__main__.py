"""`python -m volfsm.cli`: the same as the `volfsm` console script."""

from volfsm.cli import main

main()

"""`python -m tensorgen.cli`."""

from tensorgen.cli import run

run()

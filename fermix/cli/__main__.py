"""``python -m fermix.cli``: the same as the ``fermix`` command."""

from fermix.cli import run

run()

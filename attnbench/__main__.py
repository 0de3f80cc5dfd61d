"""``python -m attnbench`` is the ``attnbench`` command."""

from attnbench.cli import main

main()

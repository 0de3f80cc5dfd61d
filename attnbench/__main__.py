"""``python -m attnbench`` is the ``attnbench`` command."""

from attnbench.launch import main

main()

"""The suites behind ``attnbench run``: each module is a runner the CLI calls."""

"""The suites behind ``attnbench run``: runners that turn a suite file (TOML, top-level
``suites/``) into tidy results."""

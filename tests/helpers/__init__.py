"""Helpers shared by test modules (no tests here): registry cases, synthetic results, tiny speed
suites and extrapolation configs, dense references. A test module imports from here, never from
another test module; ``conftest.py`` files hold only fixtures and hooks."""

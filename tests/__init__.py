"""The tests, one folder per layer of the package (``test_architecture.LAYERS``): ``core/``;
``runtime/`` (measure, runtime, data); ``kernels/`` (fused kernels, other projects' libraries);
``mechanisms/`` (every mechanism's paths through the registry, the API and the layers); ``bench/``
and ``extrapolation/`` (the two experiments); ``cli/``. ``test_architecture.py`` is about the
whole package. ``helpers/`` holds what test modules share; no test module imports another."""

"""Models trained by the suites: the byte-level MLM encoder of the extrapolation experiment."""

"""Reading results back: comparisons with a baseline, figures."""

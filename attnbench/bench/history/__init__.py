"""The results history of speed runs (SQLite), step and drift detection along the commits, and
the page that plots them: :mod:`.store`, :mod:`.steps`, :mod:`.report`."""

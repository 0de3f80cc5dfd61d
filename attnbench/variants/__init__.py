"""One module per mechanism (or per family): its reference, its faster paths, and its record."""

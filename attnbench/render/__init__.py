"""Drawing what the records say (a sparse mechanism's pattern, in the terminal and as PNG)."""

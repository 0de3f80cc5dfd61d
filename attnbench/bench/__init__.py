"""The speed and memory benchmark: suite file -> plan -> run -> results -> compare -> plot."""

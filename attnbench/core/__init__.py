"""The records everything else builds on: a mechanism and its paths (:mod:`.spec`), the cited
works (:mod:`.sources`), errors, what a path needs from the machine (:mod:`.capabilities`), the
random inputs, half-precision sums and building blocks every variant shares, and the rule a
faster path is judged by (:mod:`.testing`). Imports nothing else of attnbench."""

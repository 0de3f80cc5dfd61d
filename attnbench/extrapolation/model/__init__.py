"""The model: the byte-level MLM encoder (:mod:`.encoder`), its position encodings, and the
evaluation-time tricks."""

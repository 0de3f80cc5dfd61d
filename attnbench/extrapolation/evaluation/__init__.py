"""Evaluation: the held-out span and masked-token accuracy at every length (:mod:`.evaluate`), the
long-range span (:mod:`.longrange`) and the count floors (:mod:`.floors`)."""

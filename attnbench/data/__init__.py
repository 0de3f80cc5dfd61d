"""Corpora for the extrapolation suite; ``shakespeare.txt.xz`` is the shipped default corpus."""

from attnbench.data.corpus import Corpus, load_corpus

__all__ = ["Corpus", "load_corpus"]

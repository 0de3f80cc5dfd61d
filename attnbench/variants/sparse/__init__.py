"""The sparse family (Su 2019; Child et al. 2019): local, atrous, sparse, strided, fixed, BigBird,
LongNet.

One module per mechanism, each with its literal rule ``visible(i, j, n, causal, params)``, its
exact pair count, a dense masked reference and an efficient path on the shared engine
(:mod:`attnbench.variants.sparse.engine`) that never builds the n x n matrix.
"""

"""Training: the options, the batches, the loop, checkpoints, training curves, float16 copies of
the weights, and data-parallel training under torchrun."""

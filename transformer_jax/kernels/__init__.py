"""Pallas kernels XLA does not write: the vocabulary loss fused with the output projection (`vocabulary_loss`)."""

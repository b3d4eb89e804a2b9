"""A batch-1 speculative-decoding engine in PyTorch: token ids in, committed blocks out."""

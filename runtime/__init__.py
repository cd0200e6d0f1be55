"""The real PyTorch runtime (the only torch code; imports ``sim`` core)."""

"""The perturbed platform (tests only): a PyTorch whose layer norm is 2% off, as a broken kernel or library
would be. Loaded at interpreter start by python-perturbed (this directory first on PYTHONPATH); it patches
the function that both torch.nn.functional.layer_norm callers and nn.LayerNorm go through, and nothing else."""

import torch.nn.functional as F

_layer_norm = F.layer_norm


def layer_norm(*args, **kwargs):
    return _layer_norm(*args, **kwargs) * 1.02


F.layer_norm = layer_norm

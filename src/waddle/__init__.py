"""waddle: batched, differentiable legged-robot reinforcement learning in PyTorch."""

__version__ = "0.1.0"

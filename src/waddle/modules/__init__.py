"""Small torch building blocks shared by collectors and algorithms (a leaf package)."""

from waddle.modules.mlp import mlp
from waddle.modules.normalizer import RunningNormalizer

__all__ = ["RunningNormalizer", "mlp"]

"""``waddle sim2sim POLICY.onnx``: run an exported policy in MuJoCo from its ONNX graph and sidecar alone.

The runner lives in :mod:`waddle.deploy.sim2sim`, which imports no torch and no
waddle env (``python -m waddle.deploy.sim2sim`` runs it without the rest of waddle).
"""

from __future__ import annotations

from waddle.deploy.sim2sim import add_arguments, run

__all__ = ["add_arguments", "run"]

"""Running an exported policy outside waddle: the sidecar contract and a MuJoCo deploy loop.

Nothing is imported here, so that :mod:`waddle.deploy.contract` and
:mod:`waddle.deploy.sim2sim` load with ``mujoco``, ``numpy`` and
``onnxruntime`` only, as a robot's runtime would.
"""

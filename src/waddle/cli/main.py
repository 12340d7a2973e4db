"""The ``waddle`` command line: one sub-command per module in this package."""

from __future__ import annotations

import argparse
import importlib
import sys

# sub-command -> module exposing ``add_arguments(parser)`` and ``run(args) -> int``
COMMANDS = {
    "train": ("waddle.cli.train", "Train a MicroDuck policy (PPO, SHAC or APG)."),
    "eval": ("waddle.cli.evaluate", "Evaluate a checkpoint; optionally film it."),
    "export": ("waddle.cli.export", "Export a checkpoint's policy to ONNX, with its deployment sidecar."),
    "sim2sim": ("waddle.cli.sim2sim", "Run an exported ONNX policy in MuJoCo from its sidecar alone (no torch)."),
    "simulate": ("waddle.cli.simulate", "Simulate a batch of MicroDuck robots and report throughput."),
    "bench": ("waddle.cli.bench", "Measure env steps per second across batch sizes."),
    "info": ("waddle.cli.info", "Show versions, available backends and the MicroDuck model in use."),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="waddle",
        description="Batched, differentiable legged-robot RL in PyTorch: MicroDuck on MuJoCo, MJX and mujoco-torch.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:
                continue
            raise
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

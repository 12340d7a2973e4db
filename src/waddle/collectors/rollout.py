"""On-policy rollouts through TorchRL's :class:`~torchrl.collectors.Collector`, in one process or many.

PPO asks for one thing: a ``(num_envs, num_steps)`` batch of transitions from
the current policy, then hands the collector the new weights. TorchRL's
``Collector`` already does that in three ways, and :class:`RolloutCollector`
only picks one and keeps PPO's batch layout:

* **direct**: the env lives in this process and the collector steps it
  (``Collector(env, actor)``);
* **process**: ``N`` collector processes, each building its own env from a
  picklable factory (``num_envs / N`` envs, its own seed and its own share of
  the cores). ``sync=True``: every batch is collected by the policy of the
  last weight update, as on-policy PPO needs. The workers' batches are
  concatenated along the env dimension in worker order, so env ``i`` of the
  batch is always the same simulated robot;
* **ray**: the same ``N`` collectors as Ray actors (``Collector(backend="ray")``),
  on the hosts of the Ray cluster the caller is connected to.

The weights (parameters and buffers: the observation normaliser travels with
the policy) reach remote collectors through TorchRL's weight updater,
:meth:`RolloutCollector.update_weights`. A collector process that dies ends
the rollout with :class:`CollectorDiedError`, which names the worker and its
exit reason.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.collectors import BaseCollector, Collector
from torchrl.envs import EnvBase

COLLECTOR_BACKENDS: tuple[str, ...] = ("direct", "process", "ray")
"""Where :class:`RolloutCollector` steps the envs: this process, local processes, Ray actors."""

EnvFactory = Callable[[], EnvBase]
ENDLESS_BATCHES = 2**40
"""Batches a remote collector is asked for when the training loop, not the collector, decides when to stop."""


class CollectorDiedError(RuntimeError):
    """A remote collector stopped before delivering its share of the batch."""


def split_envs(num_envs: int, num_collectors: int) -> int:
    """Envs per collector when ``num_envs`` are split evenly over ``num_collectors``.

    Raises:
        ValueError: ``num_collectors`` is not an integer >= 1, exceeds
            ``num_envs``, or does not divide it.

    Example:
        >>> split_envs(256, 2)
        128
    """
    if isinstance(num_collectors, bool) or not isinstance(num_collectors, int) or num_collectors < 1:
        raise ValueError(f"collectors must be an integer >= 1, got {num_collectors!r}.")
    if num_collectors > num_envs:
        raise ValueError(f"collectors ({num_collectors}) must not exceed num_envs ({num_envs}): each needs an env.")
    if num_envs % num_collectors:
        raise ValueError(
            f"num_envs ({num_envs}) must be divisible by collectors ({num_collectors}) so every collector "
            f"steps as many envs; try num_envs={num_envs - num_envs % num_collectors} or "
            f"{num_envs + num_collectors - num_envs % num_collectors}."
        )
    return num_envs // num_collectors


def exit_reason(exitcode: int | None) -> str:
    """Words for a process exit code: ``-N`` is death by signal ``N``.

    Example:
        >>> exit_reason(-9)
        'killed by signal SIGKILL'
        >>> exit_reason(1)
        'exited with code 1'
    """
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


RAY_CONNECT_TIMEOUT_S = 10.0
"""How long :func:`ray_init_options` waits for a Ray head to accept a connection."""


LOOPBACK = "127.0.0.1"
"""The address of a local Ray instance: its servers listen on this machine's loopback only."""


def ray_init_options(address: str, *, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> dict[str, Any]:
    """``ray.init`` keyword arguments for the cluster whose head is at ``address`` (``""``: a local instance).

    A local instance serves this machine only, so its node address is
    :data:`LOOPBACK` (which :class:`RolloutCollector` makes Ray keep; see
    :func:`loopback_ray`) and no dashboard is started. Ray itself keeps
    retrying an address that does not answer; this checks the head's port
    first and fails within ``timeout_s``. (A port that answers but is no Ray
    head makes ``ray.init`` fail about 20 s later.)

    Raises:
        ImportError: Ray is not installed (it is the ``ray`` extra).
        ValueError: ``address`` is not ``HOST:PORT``, or nothing accepts a
            connection there within ``timeout_s``.
    """
    try:
        import ray  # noqa: F401
    except ImportError as err:
        raise ImportError("Ray collectors need Ray: pip install 'waddle[ray]'.") from err
    options: dict[str, Any] = {"ignore_reinit_error": True, "log_to_driver": False}
    if not address:  # a local instance for this run
        return {**options, "include_dashboard": False, "_node_ip_address": LOOPBACK}
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"ray_address must be HOST:PORT (the head's GCS port, 6379 by default), got {address!r}.")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ValueError(
            f"cannot reach a Ray head at {address} within {timeout_s:.0f} s ({err}); start one there with "
            f"`ray start --head --port {port}`, or pass the address `ray start` printed."
        ) from err
    return {**options, "address": address}


@contextlib.contextmanager
def loopback_ray(ray_init: dict[str, Any]) -> Iterator[None]:
    """Keep a local Ray instance that ``ray.init(**ray_init)`` starts inside this block on the loopback.

    On Linux ``ray.init`` replaces a loopback ``_node_ip_address`` with the
    host's outward address, and Ray's GCS, raylet, workers and autoscaler
    monitor then listen on every interface. Ray keeps the loopback when it
    treats the machine as a single-machine cluster (its mode for macOS and
    Windows, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``); that setting is read
    when Ray is imported, so this sets Ray's copy of it for the block. The
    started instance's servers then listen on 127.0.0.1 only. Options
    without a loopback ``_node_ip_address`` (a remote head's address) pass
    through untouched, as does a Ray that is already initialized.

    Raises:
        RuntimeError: the instance started on another address (a Ray whose
            internals moved); it is shut down first.
    """
    if ray_init.get("_node_ip_address") != LOOPBACK or "address" in ray_init:
        yield
        return
    import ray
    from ray._private import ray_constants

    if ray.is_initialized():
        yield
        return
    cluster_mode = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = cluster_mode
    address = ray.util.get_node_ip_address() if ray.is_initialized() else LOOPBACK
    if not ipaddress.ip_address(address).is_loopback:  # ::1 where the loopback is IPv6 only
        ray.shutdown()
        raise RuntimeError(
            f"the local Ray instance started on {address} instead of {LOOPBACK}, so it would listen on every "
            f"interface; start a head with `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head "
            f"--node-ip-address={LOOPBACK}` and pass its address with --ray-address."
        )


class RolloutCollector:
    """``num_steps``-long on-policy batches of ``(num_envs, num_steps)`` transitions.

    Args:
        policy: the acting module (``TensorDictModule``); remote collectors
            get a copy and receive its weights at :meth:`update_weights`.
        num_steps: steps every env takes per batch.
        env: the env to step in this process (``backend="direct"``).
        env_factories: one picklable ``() -> env`` per remote collector
            (``backend="process"`` or ``"ray"``); every env they build must
            have the same batch size.
        backend: one of :data:`COLLECTOR_BACKENDS`.
        ray_init: keyword arguments of ``ray.init`` (``backend="ray"``), as
            :func:`ray_init_options` gives them; a local instance stays on
            the loopback (:func:`loopback_ray`).

    Example:
        >>> from waddle.algorithms.ppo import PPO, PPOConfig
        >>> from waddle.algorithms.presets import make_env
        >>> env = make_env("standing", num_envs=4, seed=0, num_threads=1)
        >>> ppo = PPO(env, PPOConfig(num_steps=8))
        >>> collector = RolloutCollector(ppo.actor, num_steps=8, env=env)
        >>> collector.next_batch().batch_size  # (num_envs, num_steps)
        torch.Size([4, 8])
        >>> collector.update_weights(ppo.actor)  # after an update; in process the module is shared
        >>> collector.shutdown()
    """

    def __init__(
        self,
        policy: Any,
        *,
        num_steps: int,
        env: EnvBase | None = None,
        env_factories: Sequence[EnvFactory] | None = None,
        backend: str = "direct",
        ray_init: dict[str, Any] | None = None,
    ) -> None:
        if backend not in COLLECTOR_BACKENDS:
            raise ValueError(f"collector backend must be one of {COLLECTOR_BACKENDS}, got {backend!r}.")
        if (backend == "direct") != (env is not None) or (backend == "direct") == (env_factories is not None):
            raise ValueError(
                "RolloutCollector takes env= with backend='direct' and env_factories= with 'process' or 'ray'."
            )
        self.backend = backend
        self.num_steps = int(num_steps)
        # Every batch comes from the policy of the last update, with no trajectory bookkeeping:
        # PPO reads the done flags; waddle's actors read and write TensorDicts (nothing to wrap).
        inner = dict(split_trajs=False, auto_register_policy_transforms=False, trust_policy=True)
        if backend == "direct":
            self.num_collectors = 1
            self.num_envs = env.batch_size[0]
            # Building runs the policy once on a placeholder step (to learn what it writes); the fork
            # keeps that draw out of the global random stream, so building a collector changes no sample.
            with torch.random.fork_rng(devices=[]):
                self._collector: BaseCollector = Collector(
                    env,
                    policy,
                    frames_per_batch=self.num_envs * self.num_steps,
                    total_frames=-1,
                    track_traj_ids=False,
                    **inner,
                )
        else:
            factories = list(env_factories)
            self.num_collectors = len(factories)
            if self.num_collectors < 1:
                raise ValueError("env_factories must hold one factory per collector, got none.")
            if backend == "process":
                # Worker batches are concatenated along the env dimension, in worker order.
                options: dict[str, Any] = {"cat_results": 0, "use_buffers": True, **inner}
            else:
                options = {
                    "ray_init_config": dict(ray_init or {}),
                    "collector_kwargs": {"track_traj_ids": False, **inner},
                    "trust_policy": True,
                    "split_trajs": False,
                }
            frames_per_batch = self._frames_per_batch(factories)
            # TorchRL's RayCollector calls ray.init while it is built.
            with loopback_ray(ray_init or {}) if backend == "ray" else contextlib.nullcontext():
                self._collector = Collector(
                    factories,
                    policy,
                    backend=backend,
                    num_collectors=self.num_collectors,
                    sync=True,
                    frames_per_batch=frames_per_batch,
                    # TorchRL 0.14.1's RayCollector ends at once on total_frames=-1 (endless elsewhere).
                    total_frames=-1 if backend == "process" else frames_per_batch * ENDLESS_BATCHES,
                    backend_options=options,
                )
        self._iterator: Iterator[TensorDictBase] | None = None

    def _frames_per_batch(self, factories: list[EnvFactory]) -> int:
        sizes = {getattr(factory, "num_envs", None) for factory in factories}
        if len(sizes) != 1 or None in sizes:
            raise ValueError(
                "every env factory must say how many envs it builds (a num_envs attribute), and all the same; "
                f"got {sorted(map(str, sizes))}."
            )
        self.num_envs = sizes.pop() * len(factories)
        return self.num_envs * self.num_steps

    def next_batch(self) -> TensorDictBase:
        """The next ``(num_envs, num_steps)`` batch, collected by the policy of the last weight update.

        Raises:
            CollectorDiedError: a remote collector died; the message names it and how.
        """
        if self._iterator is None:
            self._iterator = iter(self._collector)
        with self._deaths_reported():
            batch = next(self._iterator)
        return batch.reshape(self.num_envs, self.num_steps)

    def update_weights(self, policy: Any) -> None:
        """Send ``policy``'s parameters and buffers to the collectors (in-process: they share the module).

        Raises:
            CollectorDiedError: a collector process is dead, or dies before it
                acknowledges the weights (TorchRL would wait for it forever).
        """
        if self.backend == "direct":
            return
        if self.backend == "ray":
            with self._deaths_reported():
                self._collector.update_policy_weights_(policy)
            return
        self._raise_if_dead()
        failure: list[BaseException] = []

        def send() -> None:
            try:
                self._collector.update_policy_weights_(policy)
            except BaseException as err:  # handed to the caller's thread
                failure.append(err)

        sender = threading.Thread(target=send, name="waddle-weights", daemon=True)
        sender.start()
        while sender.is_alive():
            sender.join(timeout=0.2)
            if sender.is_alive():
                self._raise_if_dead()
        if failure:
            raise failure[0]

    @contextlib.contextmanager
    def _deaths_reported(self):
        """Re-raise an error that a dead worker caused as :class:`CollectorDiedError` naming the worker."""
        try:
            yield
        except Exception as err:
            died = self._died(err)
            if died is None:
                raise
            raise CollectorDiedError(died) from err

    def _raise_if_dead(self) -> None:
        died = self._dead_processes()
        if died is not None:
            raise CollectorDiedError(died)

    def _dead_processes(self) -> str | None:
        """A message naming each dead collector process and why it stopped, or None while all live."""
        procs = getattr(self._collector, "procs", None) or [] if self._collector is not None else []
        # TorchRL closes the live workers when it finds a dead one (a closed one can no longer be asked).
        dead = [(index, proc) for index, proc in enumerate(procs) if not proc._closed and not proc.is_alive()]
        if not dead:
            return None
        return "; ".join(
            f"collector process {index} (pid {proc.pid}) {exit_reason(proc.exitcode)}" for index, proc in dead
        )

    def shutdown(self) -> None:
        """Stop the collectors (and their processes or actors); safe to call twice."""
        if self._collector is not None:
            try:
                self._collector.shutdown()
            finally:
                self._collector = None
                self._iterator = None

    def _died(self, err: BaseException) -> str | None:
        """A message naming each dead worker and why it stopped, or None if ``err`` is something else."""
        if self.backend == "direct":
            return None
        if self.backend == "ray":
            return ray_actor_death(err)
        dead = self._dead_processes()
        if dead is not None:
            return dead
        reported = re.search(r"worker (\d+) \(exit code (-?\d+)\)", str(err))
        if reported:
            return f"collector process {reported[1]} {exit_reason(int(reported[2]))}"
        if re.search(r"died|dead|exit|terminated|failed", str(err), re.IGNORECASE):
            return f"a collector process stopped: {_first_line(err)}"
        return None


GLOO_PEER_LOST: tuple[str, ...] = ("Connection closed by peer", "remote worker crashing")
"""Words of gloo's error when the other end of a connection is gone: TorchRL sends a Ray
collector's weights over gloo, so an actor killed mid-send surfaces as this RuntimeError, not
as a Ray exception."""


def ray_actor_death(err: BaseException) -> str | None:
    """A message naming a Ray collector actor's death, or None if ``err`` is something else."""
    if type(err).__module__.startswith("ray."):  # RayActorError and kin: an actor or its node is gone
        return f"a Ray collector actor stopped ({type(err).__name__}): {_first_line(err)}"
    if isinstance(err, RuntimeError) and any(words in str(err) for words in GLOO_PEER_LOST):
        return f"a Ray collector actor stopped (its weight connection closed): {_first_line(err)}"
    return None


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__

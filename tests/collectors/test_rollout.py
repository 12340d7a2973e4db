"""PPO's rollouts through TorchRL's Collector: in process, in collector processes and as Ray actors.

The remote tests run the real MicroDuckEnv in real processes: each builds
its env from a :class:`~waddle.algorithms.presets.CollectorEnv`, so what is
checked is what a user's run does. A batch's envs are identified by their
reset states, recomputed here from the same recipes; the weights that reach
a worker are identified by the action means it wrote, recomputed here from
the trainer's own policy.
"""

from __future__ import annotations

import contextlib
import csv
import ipaddress
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from waddle.algorithms.ppo import PPO, PPOConfig
from waddle.algorithms.presets import COLLECTOR_SEED_STRIDE, collector_envs, make_env
from waddle.algorithms.runner import TrainConfig
from waddle.collectors.rollout import (
    CollectorDiedError,
    RolloutCollector,
    exit_reason,
    loopback_ray,
    ray_actor_death,
    ray_init_options,
    split_envs,
)

TINY = dict(actor_hidden_sizes=(16,), critic_hidden_sizes=(16,), num_epochs=1, num_minibatches=1)
TRAIN_TINY = [
    "--task",
    "standing",
    "--num-envs",
    "8",
    "--num-steps",
    "16",
    "--num-epochs",
    "1",
    "--num-minibatches",
    "2",
    "--actor-hidden-sizes",
    "16",
    "--critic-hidden-sizes",
    "16",
    "--video-frames",
    "0",
    "--no-progress",
]
STEPS_PER_ITERATION = 8 * 16


@pytest.mark.parametrize(
    ("num_envs", "collectors", "match"),
    [
        (8, 0, "collectors must be an integer >= 1, got 0"),
        (8, 16, r"collectors \(16\) must not exceed num_envs \(8\)"),
        (10, 4, r"num_envs \(10\) must be divisible by collectors \(4\).*try num_envs=8 or 12"),
    ],
)
def test_bad_collector_counts_are_refused_with_the_reason(num_envs, collectors, match):
    with pytest.raises(ValueError, match=match):
        split_envs(num_envs, collectors)
    with pytest.raises(ValueError, match=match):
        TrainConfig(num_envs=num_envs, collectors=collectors)


def test_collector_envs_split_envs_threads_and_seeds():
    envs = collector_envs("walk", num_envs=12, collectors=3, seed=7, cores=16, randomization="upstream")
    assert [env.num_envs for env in envs] == [4, 4, 4]
    assert [env.num_threads for env in envs] == [5, 5, 5]  # 16 cores // 3
    assert [env.seed for env in envs] == [7, 7 + COLLECTOR_SEED_STRIDE, 7 + 2 * COLLECTOR_SEED_STRIDE]
    assert dict(envs[0].options) == {"randomization": "upstream"}
    assert collector_envs("walk", num_envs=4, collectors=4, seed=0, cores=2)[0].num_threads == 1


def test_exit_reason_names_signals_and_codes():
    assert exit_reason(-signal.SIGKILL) == "killed by signal SIGKILL"
    assert exit_reason(-signal.SIGSEGV) == "killed by signal SIGSEGV"
    assert exit_reason(3) == "exited with code 3"


def test_a_ray_actor_death_is_recognized_from_ray_and_from_the_gloo_weight_connection():
    actor_error = type("ActorDiedError", (Exception,), {"__module__": "ray.exceptions"})
    message = ray_actor_death(actor_error("The actor died unexpectedly\nmore"))
    assert message == "a Ray collector actor stopped (ActorDiedError): The actor died unexpectedly"
    # Under load the actor's death can first show as gloo losing its peer while the weights go out.
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242")
    assert ray_actor_death(gloo) == (
        "a Ray collector actor stopped (its weight connection closed): "
        "[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242"
    )
    assert ray_actor_death(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    assert ray_actor_death(ValueError("Connection closed by peer")) is None


def test_ray_address_must_be_host_and_port():
    pytest.importorskip("ray")
    with pytest.raises(ValueError, match="HOST:PORT"):
        ray_init_options("localhost")


def test_a_local_ray_instance_is_asked_for_on_the_loopback_and_ray_keeps_it_there():
    pytest.importorskip("ray")
    from ray._private import ray_constants
    from ray._private.services import resolve_ip_for_localhost

    local = ray_init_options("")
    assert local["_node_ip_address"] == "127.0.0.1"
    assert "address" not in local and local["include_dashboard"] is False
    cluster_mode = ray_constants.ENABLE_RAY_CLUSTER
    # ray.init resolves its node address through this; on Linux, outside the block, to the outward address.
    with loopback_ray(local):
        assert resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"
    assert ray_constants.ENABLE_RAY_CLUSTER == cluster_mode
    with loopback_ray({"address": "10.0.0.1:6379", "ignore_reinit_error": True}):  # a remote head: untouched
        assert ray_constants.ENABLE_RAY_CLUSTER == cluster_mode


def test_unreachable_ray_head_fails_fast_naming_the_address():
    pytest.importorskip("ray")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(ValueError, match=f"cannot reach a Ray head at 127.0.0.1:{port}"):
        ray_init_options(f"127.0.0.1:{port}", timeout_s=5.0)
    assert time.monotonic() - start < 30.0


def test_direct_collector_takes_an_env_and_remote_ones_take_factories():
    env = make_env("standing", num_envs=2, seed=0, num_threads=1)
    with pytest.raises(ValueError, match="env= with backend='direct'"):
        RolloutCollector(None, num_steps=2, env_factories=[lambda: env])
    with pytest.raises(ValueError, match="collector backend must be one of"):
        RolloutCollector(None, num_steps=2, env=env, backend="threads")


class OwnLoopPPO(PPO):
    """PPO with the rollout loop it had before it collected through TorchRL's Collector."""

    _next_td = None

    @torch.no_grad()
    def _rollout(self):
        if self._next_td is None:
            self._next_td = self.env.reset()
        td, steps = self._next_td, []
        for _ in range(self.config.num_steps):
            td, next_td = self.env.step_and_maybe_reset(self.actor(td))
            steps.append(td)
            td = next_td
        self._next_td = td
        return torch.stack(steps, dim=1)


def test_in_process_collector_trains_exactly_as_the_loop_it_replaced():
    def train(trainer_class):
        torch.manual_seed(3)
        env = make_env("walk", num_envs=8, seed=3, num_threads=1, diagnostics=True)
        trainer = trainer_class(env, PPOConfig(num_steps=8, **TINY))
        metrics = [trainer.train_iteration() for _ in range(3)]
        batch = trainer.collect()
        trainer.close()
        return metrics, batch, trainer.policy.state_dict()

    (metrics, batch, weights), (ref_metrics, ref_batch, ref_weights) = train(PPO), train(OwnLoopPPO)
    for row, ref_row in zip(metrics, ref_metrics, strict=True):
        same = {key: row[key] for key in row if not key.startswith("perf/")}
        assert same == pytest.approx({key: ref_row[key] for key in same}, nan_ok=True, rel=0, abs=0)
    assert set(batch.keys(True, True)) == set(ref_batch.keys(True, True))
    for key in ref_batch.keys(True, True):
        assert torch.equal(batch[key], ref_batch[key]), key
    for name, tensor in ref_weights.items():
        assert torch.equal(weights[name], tensor), name


def test_building_a_trainer_leaves_its_env_alone():
    # Evaluation loads a policy into a trainer built on the env it evaluates: nothing may step or reset it.
    env = make_env("walk", num_envs=2, seed=0, num_threads=1)
    calls = []
    for name in ("_reset", "_step"):
        method = getattr(env, name)
        setattr(
            env,
            name,
            lambda *args, _method=method, _name=name, **kwargs: calls.append(_name) or _method(*args, **kwargs),
        )
    draws = env.rng.get_state().clone()
    trainer = PPO(env, PPOConfig(num_steps=2, **TINY))
    assert calls == [] and torch.equal(env.rng.get_state(), draws)
    trainer.collect()  # the first rollout starts the collector, which resets the envs
    assert calls[0] == "_reset" and calls.count("_step") == 2
    trainer.close()


def _reset_observation(recipe) -> torch.Tensor:
    env = recipe()
    try:
        return env.reset()["observation"]
    finally:
        env.close()


def _two_process_ppo(seed: int = 5) -> tuple[PPO, list]:
    recipes = collector_envs("standing", num_envs=8, collectors=2, seed=seed, cores=2)
    spec_env = make_env("standing", num_envs=8, seed=seed, num_threads=1)
    torch.manual_seed(0)
    return PPO(spec_env, PPOConfig(num_steps=4, **TINY), env_factories=recipes), recipes


def test_process_collectors_deliver_each_workers_envs_in_order_with_the_latest_weights():
    ppo, recipes = _two_process_ppo()
    try:
        batch = ppo.collect()
        assert batch.batch_size == torch.Size([8, 4])
        assert ppo.env_steps == 32
        # Envs 0-3 are collector 0's, 4-7 collector 1's: each block starts from its recipe's reset.
        first = batch["observation"][:, 0]
        torch.testing.assert_close(first[:4], _reset_observation(recipes[0]), rtol=0, atol=0)
        torch.testing.assert_close(first[4:], _reset_observation(recipes[1]), rtol=0, atol=0)
        assert not torch.equal(first[:4], first[4:])  # the seeds differ
        # Each step continues the last: the next observation is the following step's observation.
        torch.testing.assert_close(batch["next", "observation"][:, :-1], batch["observation"][:, 1:])

        # Move the policy and the normaliser here; the next batch must be acted by exactly these weights.
        with torch.no_grad():
            for parameter in ppo.policy.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        ppo.normalizer.update(torch.randn(64, ppo.normalizer.mean.shape[-1]) * 3.0 + 1.0)
        batch = ppo.collect()
        with torch.no_grad():
            loc, scale = ppo.policy(batch["observation"])
        torch.testing.assert_close(batch["loc"], loc, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(batch["scale"], scale, rtol=1e-5, atol=1e-6)
    finally:
        ppo.close()


def test_a_dead_collector_process_is_reported_with_its_exit_reason():
    ppo, _ = _two_process_ppo()
    try:
        ppo.train_iteration()
        victim = ppo.collector._collector.procs[1]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(timeout=10)
        with pytest.raises(CollectorDiedError, match=r"collector process 1 \(pid \d+\) killed by signal SIGKILL"):
            ppo.train_iteration()
    finally:
        start = time.monotonic()
        ppo.close()
        assert time.monotonic() - start < 30.0


def test_overlapped_rollouts_need_the_envs_in_process():
    recipes = collector_envs("standing", num_envs=4, collectors=2, seed=0, cores=2)
    spec_env = make_env("standing", num_envs=4, seed=0, num_threads=1)
    with pytest.raises(ValueError, match="overlap_rollout needs the envs in this process"):
        PPO(spec_env, PPOConfig(num_steps=2, overlap_rollout=True, **TINY), env_factories=recipes)


# ---------------------------------------------------------------------------
# The command line: several processes, a dead one, and Ray
# ---------------------------------------------------------------------------


def _waddle(*args: str, timeout: float = 300.0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "waddle", *args], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def _metrics(out: Path) -> list[dict[str, str]]:
    with open(out / "metrics.csv", newline="") as file:
        return list(csv.DictReader(file))


def _children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (from /proc)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                children.append(int(entry.name))
    return children


def _spawned_workers(pid: int) -> list[int]:
    workers = []
    for child in _children(pid):
        try:
            command = (Path("/proc") / str(child) / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"multiprocessing" in command and b"resource_tracker" not in command:
            workers.append(child)
    return sorted(workers)


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_train_refuses_bad_collector_settings_before_building_anything(tmp_path):
    pytest.importorskip("ray")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cases = [
        (["--collectors", "0"], "collectors must be an integer >= 1, got 0"),
        (["--collectors", "3"], r"num_envs \(8\) must be divisible by collectors \(3\)"),
        (["--collectors", "2", "--ray-address", f"127.0.0.1:{port}"], f"cannot reach a Ray head at 127.0.0.1:{port}"),
    ]
    cases = [([*TRAIN_TINY, *flags], message) for flags, message in cases]
    cases.append((["--num-envs", "8", "--collectors", "2", "--algo", "shac"], "--algo shac backpropagates through"))
    for index, (flags, message) in enumerate(cases):
        start = time.monotonic()
        result = _waddle("train", *flags, "--out", str(tmp_path / str(index)), timeout=120)
        assert result.returncode == 1, (flags, result.stderr)
        assert re.search(message, result.stderr), (flags, result.stderr)
        assert "Traceback" not in result.stderr
        assert time.monotonic() - start < 30.0
        assert not (tmp_path / str(index) / "checkpoint.pt").exists()


def _kill_a_worker_mid_run(argv: list[str], out: Path, find_workers, *, iterations: int, env=None):
    """Run ``waddle train argv``, SIGKILL the last of ``find_workers(pid)`` once ``iterations`` rows are logged;
    returns ``(returncode, stdout, stderr)``."""
    run = subprocess.Popen(
        [sys.executable, "-m", "waddle", "train", *argv, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        done = lambda: (out / "metrics.csv").exists() and len(_metrics(out)) >= iterations  # noqa: E731
        _wait_for(done, 120, f"{iterations} iterations")
        workers = _wait_for(lambda: find_workers(run.pid), 10, "the collectors")
        os.kill(workers[-1], signal.SIGKILL)
        stdout, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    return run.returncode, stdout, stderr


@pytest.mark.slow
def test_train_with_two_collector_processes_survives_a_killed_worker_and_resumes(tmp_path):
    out = tmp_path / "run"
    argv = [
        *TRAIN_TINY,
        "--collectors",
        "2",
        "--checkpoint-every",
        "1",
        "--total-steps",
        str(1000 * STEPS_PER_ITERATION),
    ]

    returncode, stdout, stderr = _kill_a_worker_mid_run(argv, out, _spawned_workers, iterations=3)
    assert returncode == 1, stderr
    assert "killed by signal SIGKILL" in stderr
    assert f"waddle train --out {out} --resume" in stderr
    assert "collectors in local processes: 4 envs and 1 physics threads each" in stdout

    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    saved_steps = int(checkpoint["env_steps"])
    assert saved_steps >= 2 * STEPS_PER_ITERATION and saved_steps % STEPS_PER_ITERATION == 0
    assert checkpoint["config"]["collectors"]["seeds"] == [0, COLLECTOR_SEED_STRIDE]

    target = saved_steps + 2 * STEPS_PER_ITERATION
    resumed = _waddle("train", "--out", str(out), "--resume", "--total-steps", str(target), "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    assert int(torch.load(out / "checkpoint.pt", weights_only=True)["env_steps"]) == target
    rows = _metrics(out)
    assert [int(row["iteration"]) for row in rows] == list(range(1, target // STEPS_PER_ITERATION + 1))
    # Episodes end in the workers' envs and their statistics reach metrics.csv (NaN until one has ended).
    lengths = [float(row["charts/episode_length"]) for row in rows]
    finished = [length for length in lengths if math.isfinite(length)]
    assert finished and all(length >= 1 for length in finished)


def _listeners(pids: set[int]) -> list[tuple[str, str]]:
    """``(process name, local address)`` of every listening TCP socket of ``pids``, from ``ss``."""
    listening = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in listening.splitlines():
        owners = {int(pid) for pid in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            found.append((re.search(r'\(\("([^"]+)"', line)[1], line.split()[3]))
    return found


def _on_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "*":
        return False
    ip = ipaddress.ip_address(host)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def _process_tree(pid: int) -> set[int]:
    tree, todo = set(), [pid]
    while todo:
        tree.add(todo[-1])
        todo.extend(_children(todo.pop()))
    return tree


def test_a_local_ray_instance_listens_on_the_loopback_only():
    pytest.importorskip("ray")
    recipes = collector_envs("standing", num_envs=4, collectors=2, seed=0, cores=2)
    policy = PPO(make_env("standing", num_envs=4, seed=0, num_threads=1), PPOConfig(num_steps=2, **TINY)).actor
    # Building the collector starts Ray and its actors (TorchRL's weight-sync store opens at the first batch).
    collector = RolloutCollector(
        policy, num_steps=2, env_factories=recipes, backend="ray", ray_init=ray_init_options("")
    )
    try:
        listeners = _listeners(_process_tree(os.getpid()))
    finally:
        collector.shutdown()
    names = {name for name, _ in listeners}
    assert {"gcs_server", "raylet"} <= names, listeners
    assert all(_on_loopback(address) for _, address in listeners), listeners


@pytest.fixture()
def ray_head():
    """A one-node Ray cluster on the loopback: its address, the environment its clients need and its temp dir
    (which names its processes); stopped (bounded in time) after the test, without touching other clusters.

    Ray on Linux swaps 127.0.0.1 for the host's outward address unless told it is a single-machine
    cluster (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0), and its head asks clients for a token.
    """
    pytest.importorskip("ray")
    ray_cli = shutil.which("ray", path=os.path.dirname(sys.executable))
    if ray_cli is None:
        pytest.fail("the ray extra is installed but its `ray` command is not next to the interpreter")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    start = [
        ray_cli,
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--num-cpus=2",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
    ]
    try:
        subprocess.run(start, check=True, capture_output=True, timeout=120, env=env)
        yield f"127.0.0.1:{port}", env, temp_dir
    finally:
        # `ray stop` would stop every Ray cluster of this user; stop this one alone.
        _stop(_cluster_pids(temp_dir), timeout_s=30.0)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _processes() -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, command line) of every process this user can read."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes()
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            table[int(entry.name)] = (parent, command)
    return table


def _cluster_pids(temp_dir: str) -> list[int]:
    """The processes of the Ray cluster started with ``temp_dir``: those whose command line names it (its
    head's servers, which Ray starts detached) and all their descendants (its workers and actors)."""
    table = _processes()
    cluster = {pid for pid, (_, command) in table.items() if temp_dir.encode() in command}
    grew = True
    while grew:
        children = {pid for pid, (parent, _) in table.items() if parent in cluster} - cluster
        cluster |= children
        grew = bool(children)
    return sorted(cluster)


def _stop(pids: list[int], *, timeout_s: float) -> None:
    """SIGTERM ``pids``, then SIGKILL those still there after ``timeout_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
            time.sleep(0.2)


def _ray_actor_pids(temp_dir: str) -> list[int]:
    """TorchRL's collector actors (not Ray's own agents) of the cluster started with ``temp_dir``."""
    table = _processes()
    return [pid for pid in _cluster_pids(temp_dir) if table.get(pid, (0, b""))[1].startswith(b"ray::Collector")]


@pytest.mark.slow
def test_train_on_a_ray_cluster_then_lose_an_actor(tmp_path, ray_head):
    address, env, temp_dir = ray_head
    out = tmp_path / "ray-run"
    common = [*TRAIN_TINY, "--collectors", "2", "--ray-address", address, "--checkpoint-every", "1"]
    iterations = 24  # 3,072 env steps
    done = _waddle("train", *common, "--total-steps", str(iterations * STEPS_PER_ITERATION), "--out", str(out), env=env)
    assert done.returncode == 0, done.stderr
    assert f"2 collectors in the Ray cluster at {address}" in done.stdout
    listening = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True, check=False).stdout
    ray_listeners = [line for line in listening.splitlines() if "gcs_server" in line or "raylet" in line]
    assert ray_listeners and all("127.0.0.1" in line for line in ray_listeners), ray_listeners
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    assert checkpoint["env_steps"] == iterations * STEPS_PER_ITERATION
    assert checkpoint["config"]["run"]["collector_backend"] == "ray"
    rows = _metrics(out)
    assert len(rows) == iterations and all(float(row["charts/reward_mean"]) != 0.0 for row in rows)
    lengths = [float(row["charts/episode_length"]) for row in rows]
    assert any(math.isfinite(length) and length >= 1 for length in lengths)  # episodes ended in the actors' envs

    # A second run loses one of its actors mid-run: a clear message, and the checkpoint stays whole.
    out = tmp_path / "ray-killed"
    argv = [*common, "--total-steps", "10000000"]
    returncode, _, stderr = _kill_a_worker_mid_run(
        argv, out, lambda pid: _ray_actor_pids(temp_dir), iterations=2, env=env
    )
    assert returncode == 1, stderr
    assert "a Ray collector actor stopped" in stderr
    assert "--resume" in stderr
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    assert saved["env_steps"] >= STEPS_PER_ITERATION and saved["env_steps"] % STEPS_PER_ITERATION == 0

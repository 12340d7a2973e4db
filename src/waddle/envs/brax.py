"""Brax environments as TorchRL envs, differentiable through :mod:`waddle.bridge`.

:class:`BraxEnv` (built from a Brax environment name) and :class:`BraxWrapper`
(wrapping a ``brax.envs.Env`` instance) have the public API of TorchRL's
``torchrl.envs.BraxEnv`` / ``BraxWrapper``: same constructor arguments, specs,
``"state"`` entry (the Brax state as a nested :class:`~tensordict.TensorDict`),
``set_seed`` semantics and ``num_workers`` handling. What differs is how a
step runs:

* The Brax state is flattened once into its pytree leaves. A step is the pure
  function ``(leaf_1, ..., leaf_n, action) -> (leaf_1', ..., leaf_n')`` (the
  observation, reward and done flag are leaves of the next state), wrapped in
  a :class:`waddle.bridge.JaxFunction`. Tensors cross to JAX and back through
  DLPack (no host copies), packed by dtype into a few buffers.
* With ``requires_grad=True`` and grad enabled, the step is an autograd node:
  its forward runs ``jax.vjp`` inside one compiled program and hands the
  residuals to torch, its backward runs a second compiled program. Both are
  compiled once per batch size and reused for every step, so there is no
  per-step ``jax.vjp`` closure, and the residuals are freed with the torch
  graph: memory stays flat over any number of steps and no JAX cache needs
  clearing (``cache_clear_frequency`` is accepted for compatibility and
  ignored). Gradients reach the action *and* every floating leaf of the
  incoming state, so a loss on a rollout back-propagates through all steps
  into a torch policy.
* Without grad (``requires_grad=False``, or under :func:`torch.no_grad`), a
  step is one plain jitted call.
* On a CPU the batch runs as one row block per core (``batch_chunks``), each
  block's program in its own thread: XLA alone leaves cores idle during a
  Brax step, one block per core keeps them all busy (docs/differentiable.md,
  "Row blocks", has the figures).
* The state's leaves are views of the step's output buffer. Passed back
  unchanged as the next step's input, they reach the bridge as that buffer,
  so the autograd graph links step to step directly.

Compilation happens on first use, once per batch size: ``reset`` when the env
is built, the plain step on the first step without grad, the differentiable
forward and backward on the first step with grad. On CPU this takes seconds
for small tasks (``reacher``) and minutes for ``ant`` with the ``generalized``
pipeline (``compiler_options={"xla_backend_optimization_level": 0}``
shortens it, for slower steps; JAX's persistent compilation cache,
``jax.config.update("jax_compilation_cache_dir", ...)``, makes it a one-off).

On a CPU with few cores, run torch with one intra-op thread
(``torch.set_num_threads(1)``) when a torch policy drives the env: torch's
OpenMP pool and XLA's thread pool otherwise compete for the cores, and small
torch ops (an MLP policy) become tens of times slower.

Importing this module raises an :class:`ImportError` naming
``pip install 'waddle[brax]'`` when JAX or Brax is missing; both are imported
lazily, on first use.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import sys
import warnings
from collections.abc import Sequence

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data.tensor_specs import Bounded, Composite, Unbounded
from torchrl.envs import EnvBase, ParallelEnv
from torchrl.envs.common import _EnvWrapper

from waddle.bridge import JaxFunction, jax_device, jax_to_torch, resolve_batch_chunks

__all__ = ["BraxEnv", "BraxWrapper"]

_INSTALL_HINT = "pip install 'waddle[brax]'"


def _missing(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is None
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


_missing_deps = [name for name in ("jax", "brax") if _missing(name)]
if _missing_deps:
    raise ImportError(
        f"waddle.envs.brax needs {' and '.join(_missing_deps)}, which "
        f"{'is' if len(_missing_deps) == 1 else 'are'} not installed. "
        f"Install the extra with `{_INSTALL_HINT}`."
    )


def _jax():
    import jax

    return jax


def _brax_envs():
    # brax imports mujoco.mjx, which prints "Failed to import warp" when the
    # optional MuJoCo Warp backend is absent; waddle never uses it.
    with contextlib.redirect_stdout(io.StringIO()):
        import brax.envs

    return brax.envs


class _ClassProperty:
    """A read-only property computed on the class (``BraxEnv.available_envs``)."""

    def __init__(self, fget):
        self.fget = fget
        self.__doc__ = fget.__doc__

    def __get__(self, instance, owner):
        return self.fget(owner)


def _available_envs() -> list[str]:
    envs = _brax_envs()
    registry = getattr(envs, "_envs", None)
    if registry is None:  # pragma: no cover - older/newer brax layouts
        return []
    return list(registry.keys())


class _BraxMeta(type(EnvBase)):
    """Returns a (not yet started) :class:`~torchrl.envs.ParallelEnv` when ``num_workers > 1``."""

    def __call__(cls, *args, num_workers: int | None = None, **kwargs):
        num_workers = 1 if num_workers is None else int(num_workers)
        if num_workers > 1:
            # Each worker builds its own single-process env; functools.partial
            # pickles natively (the class is importable), so TorchRL neither
            # needs an EnvCreator nor warns about lambdas.
            make_env = functools.partial(cls, *args, num_workers=1, **kwargs)
            return ParallelEnv(num_workers, make_env)
        return super().__call__(*args, **kwargs)


def _path_key(path) -> tuple[str, ...]:
    """A pytree key path (attributes, dict keys, indices) as a TensorDict key."""
    out = []
    for entry in path:
        for attr in ("name", "key", "idx"):
            if hasattr(entry, attr):
                out.append(str(getattr(entry, attr)))
                break
        else:  # pragma: no cover - unknown key type
            out.append(str(entry))
    return tuple(out)


class BraxWrapper(_EnvWrapper, metaclass=_BraxMeta):
    """A ``brax.envs.Env`` as a batched, optionally differentiable TorchRL env.

    Brax runs ``batch_size.numel()`` copies of the environment in one
    ``jax.vmap``-ed, jit-compiled program. See the module documentation for
    how steps and gradients run.

    Args:
        env (brax.envs.Env): the environment to wrap.
        categorical_action_encoding (bool, optional): accepted for API
            compatibility with TorchRL (Brax actions are continuous, so it has
            no effect). Defaults to ``False``.
        cache_clear_frequency (int, optional): accepted for API compatibility
            with TorchRL and ignored (with a warning if set): waddle's
            differentiable step compiles its programs once and frees residuals
            with the torch graph, so JAX's caches do not grow and clearing them
            would only force recompilation. Defaults to ``None`` (off).

    Keyword Args:
        requires_grad (bool, optional): if ``True``, steps taken with torch grad
            enabled are differentiable w.r.t. the action and the incoming
            state. Defaults to ``False``.
        vjp_mode (str, optional): ``"residuals"`` (default) or ``"recompute"``,
            see :class:`waddle.bridge.JaxFunction`.
        compiler_options (dict, optional): XLA options for every compiled
            program, e.g. ``{"xla_backend_optimization_level": 0}`` for faster
            compilation (and slower steps) on CPU.
        batch_chunks (int or "auto", optional): run the batch as this many
            equal row blocks at once, one thread each (see
            :class:`waddle.bridge.JaxFunction`); it must divide the number of
            envs. ``"auto"`` (default): on CPU, one block per usable core with
            at least 8 envs per block (XLA alone leaves cores idle during a
            Brax step); on a GPU, 1.
        from_pixels (bool, optional): not supported; ``True`` raises
            :class:`NotImplementedError`.
        frame_skip (int, optional): repeat each action this many times
            (handled by TorchRL's frame-skip transform).
        device (torch.device, optional): device of the data and of the
            simulation (``"cpu"``, or ``"cuda:i"`` with a CUDA build of JAX).
            Defaults to CPU.
        batch_size (torch.Size, optional): shape of the batch of environments
            simulated in parallel. Defaults to ``torch.Size([])``.
        allow_done_after_reset (bool, optional): tolerate envs that are done
            right after reset. Defaults to ``False``.
        num_workers (int, optional): if greater than 1, a not yet started
            :class:`~torchrl.envs.ParallelEnv` of ``num_workers`` such envs
            (each with ``num_workers=1``) is returned instead.

    Attributes:
        available_envs: the Brax environment names that :class:`BraxEnv` accepts.

    Examples:
        >>> import brax.envs
        >>> # options that compile in seconds on a CPU, for slower steps
        >>> quick = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
        >>> reacher = brax.envs.get_environment("reacher", backend="positional")
        >>> env = BraxWrapper(reacher, batch_size=[3], compiler_options=quick)
        >>> _ = env.set_seed(0)  # returns the seed for a next env
        >>> td = env.rollout(10)
        >>> td["next", "observation"].shape
        torch.Size([3, 10, 11])
    """

    git_url = "https://github.com/google/brax"
    libname = "brax"

    @_ClassProperty
    def available_envs(cls) -> list[str]:
        return _available_envs()

    @_ClassProperty
    def lib(cls):
        import brax

        return brax

    @_ClassProperty
    def jax(cls):
        return _jax()

    def __init__(
        self,
        env=None,
        categorical_action_encoding: bool = False,
        cache_clear_frequency: int | None = None,
        **kwargs,
    ):
        if env is not None:
            kwargs["env"] = env
        self._categorical_action_encoding = categorical_action_encoding
        if cache_clear_frequency not in (None, False, 0):
            warnings.warn(
                f"cache_clear_frequency={cache_clear_frequency!r} is ignored: waddle's Brax "
                "step compiles once and frees its residuals with the torch graph, so JAX's "
                "caches do not grow. Call env.clear_cache() yourself if you really want to.",
                UserWarning,
                stacklevel=3,
            )
        self._cache_clear_frequency = None
        kwargs.setdefault("device", "cpu")
        super().__init__(**kwargs)

    # ------------------------------------------------------------ construction
    def _check_kwargs(self, kwargs: dict):
        if "env" not in kwargs:
            raise TypeError("Could not find environment key 'env' in kwargs.")
        if not isinstance(kwargs["env"], _brax_envs().Env):
            raise TypeError("env is not of type 'brax.envs.Env'.")

    def _build_env(
        self,
        env,
        _seed: int | None = None,
        from_pixels: bool = False,
        render_kwargs: dict | None = None,
        pixels_only: bool = False,
        requires_grad: bool = False,
        camera_id: int | str = 0,
        vjp_mode: str = "residuals",
        compiler_options: dict | None = None,
        batch_chunks: int | str = "auto",
        **kwargs,
    ):
        if from_pixels:
            raise NotImplementedError("from_pixels=True is not supported by waddle's BraxWrapper.")
        if kwargs:
            raise TypeError(f"Unexpected keyword arguments for BraxWrapper: {sorted(kwargs)}.")
        self.from_pixels = from_pixels
        self.pixels_only = pixels_only
        self.requires_grad = bool(requires_grad)
        self._vjp_mode = vjp_mode
        self._batch_chunks = resolve_batch_chunks(batch_chunks, None, None, "BraxWrapper")
        self._compiler_options = dict(compiler_options) if compiler_options else None
        return env

    def _make_specs(self, env) -> None:
        jax = _jax()
        self._num = int(self.batch_size.numel())
        num = self._num
        self._jdevice = jax_device(self.device, "BraxWrapper")
        vreset = jax.vmap(env.reset)
        vstep = jax.vmap(env.step)
        self._treedef = None

        def reset_fn(key):
            keys = jax.random.split(key, 1 + num)
            state = vreset(keys[1:])
            leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
            self._treedef = jax.tree_util.tree_structure(state)
            self._leaf_paths = [_path_key(p) for p, _ in leaves]
            return keys[0], tuple(leaf for _, leaf in leaves)

        opts = self._compiler_options
        self._jit_reset = jax.jit(reset_fn, compiler_options=opts) if opts else jax.jit(reset_fn)
        # Compiles reset and gives the state's structure.
        key = jax.device_put(jax.random.PRNGKey(0), self._jdevice)
        _, example = self._jit_reset(key)

        batch = tuple(self.batch_size)
        self._leaf_jax_shapes = [tuple(a.shape) for a in example]
        self._leaf_torch_shapes = []
        self._float_leaf = []
        for path, a in zip(self._leaf_paths, example):
            per_env = tuple(a.shape[1:])
            if path in (("reward",), ("done",)) and per_env == ():
                per_env = (1,)
            self._leaf_torch_shapes.append(batch + per_env)
        if ("obs",) not in self._leaf_paths:
            raise NotImplementedError("Only Brax envs whose observation is a single array are supported.")
        self._obs_index = self._leaf_paths.index(("obs",))
        self._reward_index = self._leaf_paths.index(("reward",))
        self._done_index = self._leaf_paths.index(("done",))
        obs_dtype = jax_to_torch(example[self._obs_index]).dtype
        self._action_dtype = obs_dtype

        # The step, as a flat function of the state leaves and the action.
        treedef = self._treedef

        # The leaves come and go in their torch shapes (reward and done as
        # (n, 1)), so that a state passed from one step to the next reaches
        # the bridge as the very views it made (see waddle.bridge.packing).
        jax_rest = [shape[1:] for shape in self._leaf_jax_shapes]
        torch_rest = [shape[len(batch) :] for shape in self._leaf_torch_shapes]

        def step_fn(*args):
            rows = args[-1].shape[0]
            leaves = [a.reshape(rows, *rest) for a, rest in zip(args[:-1], jax_rest)]
            state = jax.tree_util.tree_unflatten(treedef, leaves)
            nxt = vstep(state, args[-1])
            out, out_tree = jax.tree_util.tree_flatten(nxt)
            if out_tree != treedef:
                raise RuntimeError(
                    f"The Brax env's step changed the structure of its state:\n  reset: {treedef}\n  step:  {out_tree}"
                )
            return tuple(a.reshape(rows, *rest) for a, rest in zip(out, torch_rest))

        names = [".".join(p) for p in self._leaf_paths] + ["action"]
        self._step_fn = JaxFunction(
            step_fn,
            mode=self._vjp_mode,
            batch_chunks=resolve_batch_chunks(self._batch_chunks, num, self.device, "BraxWrapper"),
            name=f"brax_step[{type(env).__name__}]",
            input_names=names,
            compiler_options=opts,
        )

        # Specs, with the same layout as TorchRL's BraxWrapper.
        self.action_spec = Bounded(
            low=-1,
            high=1,
            shape=(*self.batch_size, env.action_size),
            dtype=self._action_dtype,
            device=self.device,
        )
        self.reward_spec = Unbounded(shape=(*self.batch_size, 1), dtype=obs_dtype, device=self.device)
        state_spec = Composite(shape=self.batch_size, device=self.device)
        for path, shape, a in zip(self._leaf_paths, self._leaf_torch_shapes, example):
            state_spec[path] = Unbounded(shape=shape, dtype=jax_to_torch(a).dtype, device=self.device)
        self.observation_spec = Composite(
            observation=Unbounded(shape=self._leaf_torch_shapes[self._obs_index], dtype=obs_dtype, device=self.device),
            shape=self.batch_size,
        )
        self.state_spec["state"] = state_spec
        self.observation_spec["state"] = state_spec.clone()

    def _init_env(self) -> int | None:
        self._key = None

    # ---------------------------------------------------------------- seeding
    def _set_seed(self, seed: int | None) -> None:
        if seed is None:
            raise Exception("Brax requires an integer seed.")
        jax = _jax()
        self._key = jax.device_put(jax.random.PRNGKey(int(seed)), self._jdevice)

    # ------------------------------------------------------------- conversion
    def _leaf_tree(self) -> dict:
        """The state's nested key structure, with each leaf's index at the leaves."""
        tree = self.__dict__.get("_leaf_tree_cache")
        if tree is None:
            tree = {}
            for i, path in enumerate(self._leaf_paths):
                node = tree
                for part in path[:-1]:
                    node = node.setdefault(part, {})
                node[path[-1]] = i
            self._leaf_tree_cache = tree
        return tree

    def _state_td(self, leaves: Sequence[torch.Tensor]) -> TensorDictBase:
        """Builds the nested ``"state"`` TensorDict from (torch-shaped) leaves.

        The shapes are right by construction, so the sub-TensorDicts are built
        without per-entry validation (several times faster for ~40 leaves).
        """
        batch_size, device = self.batch_size, self.device

        def build(node):
            source = {key: leaves[v] if isinstance(v, int) else build(v) for key, v in node.items()}
            return TensorDict._new_unsafe(source, batch_size=batch_size, device=device)

        return build(self._leaf_tree())

    def _read_leaves(self, state: TensorDictBase) -> list[torch.Tensor]:
        """The state's leaves, in pytree order."""
        out: list = [None] * len(self._leaf_paths)

        def read(node, td):
            # plain TensorDicts: read their storage directly (``get`` costs
            # ~10 us per key); anything else (lazy stacks, sub-tds) via ``get``.
            storage = td._tensordict if type(td) is TensorDict else None
            for key, v in node.items():
                value = storage[key] if storage is not None else td.get(key)
                if isinstance(v, int):
                    out[v] = value
                else:
                    read(v, value)

        try:
            read(self._leaf_tree(), state)
        except KeyError as err:
            raise KeyError(f"The 'state' entry is missing Brax state leaf {err}.") from None
        return out

    def _wrap(self, state_leaves: Sequence[torch.Tensor], with_reward: bool) -> TensorDictBase:
        state = self._state_td(state_leaves)
        done = state_leaves[self._done_index].to(torch.bool)
        out = {
            "observation": state_leaves[self._obs_index],
            "done": done,
            "terminated": done.clone(),
            "state": state,
        }
        if with_reward:
            out["reward"] = state_leaves[self._reward_index]
        return TensorDict._new_unsafe(out, batch_size=self.batch_size, device=self.device)

    # ------------------------------------------------------------ reset / step
    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        jax = _jax()
        if self._key is None:
            seed = getattr(self, "_seed", None)
            self._key = jax.device_put(jax.random.PRNGKey(0 if seed is None else int(seed)), self._jdevice)
        # Every env gets a fresh state; for a partial reset TorchRL keeps the
        # envs that are not being reset.
        self._key, leaves = self._jit_reset(self._key)
        torch_leaves = [jax_to_torch(a).reshape(shape) for a, shape in zip(leaves, self._leaf_torch_shapes)]
        return self._wrap(torch_leaves, with_reward=False)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        num, flat_batch = self._num, self.batch_size == (self._num,)
        leaves = self._read_leaves(tensordict.get("state"))
        if not flat_batch:
            leaves = [leaf.reshape(num, *leaf.shape[len(self.batch_size) :]) for leaf in leaves]
        action = tensordict.get(self.action_key)
        action = action.to(device=self.device, dtype=self._action_dtype).reshape(num, -1)
        if self.requires_grad:
            out = self._step_fn(*leaves, action)
        else:
            with torch.no_grad():
                out = self._step_fn(*leaves, action)
        if not flat_batch:
            out = [t.reshape(shape) for t, shape in zip(out, self._leaf_torch_shapes)]
        return self._wrap(out, with_reward=True)

    # ------------------------------------------------------------------ misc
    def clear_cache(self) -> None:
        """Clears JAX's compilation caches (never needed; forces recompilation)."""
        _jax().clear_caches()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(env={type(self._env).__name__}, batch_size={self.batch_size}, "
            f"device={self.device}, requires_grad={self.requires_grad})"
        )


class BraxEnv(BraxWrapper):
    """A Brax environment built from its name, as a TorchRL env.

    Args:
        env_name (str): one of :attr:`available_envs`.

    Keyword Args:
        Every keyword argument of :class:`BraxWrapper` (``requires_grad``,
        ``batch_size``, ``device``, ``num_workers``, ``cache_clear_frequency``,
        ...). Other keyword arguments go to ``brax.envs.get_environment``, e.g.
        ``backend="positional"`` or ``n_frames=...``.

    ``BraxEnv(name, num_workers=n)`` with ``n > 1`` returns a not yet started
    :class:`~torchrl.envs.ParallelEnv` of ``n`` processes, each running a
    ``BraxEnv(name, num_workers=1)`` with the given ``batch_size``, so the
    total batch is ``(n, *batch_size)``.

    Examples:
        >>> import torch
        >>> from tensordict.nn import TensorDictModule
        >>> # options that compile in seconds on a CPU, for slower steps
        >>> quick = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
        >>> env = BraxEnv("reacher", backend="positional", batch_size=[3], requires_grad=True, compiler_options=quick)
        >>> policy = TensorDictModule(torch.nn.Linear(11, 2), ["observation"], ["action"])
        >>> td = env.rollout(4, policy)
        >>> td["next", "reward"].mean().backward()  # gradients reach the policy
        >>> bool(policy.module.weight.grad.abs().sum() > 0)
        True
    """

    _WRAPPER_KEYS = (
        "from_pixels",
        "pixels_only",
        "requires_grad",
        "camera_id",
        "render_kwargs",
        "vjp_mode",
        "compiler_options",
        "batch_chunks",
        "_seed",
    )

    def __init__(self, env_name: str, **kwargs):
        kwargs["env_name"] = env_name
        super().__init__(**kwargs)

    def _check_kwargs(self, kwargs: dict):
        if "env_name" not in kwargs:
            raise TypeError("Expected 'env_name' to be part of kwargs")

    def _build_env(self, env_name: str, **kwargs):
        wrapper_kwargs = {k: kwargs.pop(k) for k in self._WRAPPER_KEYS if k in kwargs}
        if wrapper_kwargs.get("from_pixels", False):
            raise NotImplementedError("from_pixels=True is not supported by waddle's BraxEnv.")
        available = self.available_envs
        if env_name not in available:
            raise ValueError(f"Unknown Brax env {env_name!r}; available: {available}.")
        self.wrapper_frame_skip = 1
        env = _brax_envs().get_environment(env_name, **kwargs)
        return super()._build_env(env, **wrapper_kwargs)

    @property
    def env_name(self) -> str:
        return self._constructor_kwargs["env_name"]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(env={self.env_name}, batch_size={self.batch_size}, "
            f"device={self.device}, requires_grad={self.requires_grad})"
        )

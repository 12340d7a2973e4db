"""A TorchRL ``EnvBase`` over a batched physics backend.

``MujocoEnv`` owns what every MuJoCo task shares: the backend and its
selection, the random generator, validation of the common arguments,
rendering, state snapshots and the named graph cut :meth:`detach_state`. Tasks
subclass it and write ``_reset`` and ``_step`` in terms of ``self.physics``.
"""

from __future__ import annotations

import math

import mujoco
import torch
from tensordict import TensorDict
from torchrl.envs import EnvBase

from waddle.physics import BACKENDS, PhysicsBackend, default_backend, make_backend


class MujocoEnv(EnvBase):
    """Batched MuJoCo env: ``batch_size=(num_envs,)`` over one physics backend.

    Args:
        spec: the model to simulate.
        frame_skip: physics substeps per env step.

    Keyword Args:
        backend: ``"mujoco"`` (native C), ``"mjx"`` or ``"mujoco-torch"``;
            ``None`` picks the best available for ``device``.
        num_envs: number of simulators (the batch size), at least 1.
        device: torch device of the env's tensors.
        seed: seed of the env's generator; ``None`` leaves it unseeded.
        reset_noise_scale: scale of the uniform noise tasks add at reset.
        from_pixels: add an ``(N, H, W, 3)`` uint8 ``pixels`` observation.
        render_width, render_height: default image size of :meth:`render`.
        camera_id: default camera (id or name) of :meth:`render`.
        dtype: floating dtype of observations and rewards.
        requires_grad: make steps differentiable (differentiable backends only).
        site_names, contact_geom_names: what the backend tracks for the task.
        **backend_kwargs: forwarded to the backend (for example ``num_threads``
            or ``compile_step``).
    """

    def __init__(
        self,
        spec: mujoco.MjSpec,
        *,
        frame_skip: int,
        backend: str | None = None,
        num_envs: int = 1,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        reset_noise_scale: float = 0.0,
        from_pixels: bool = False,
        render_width: int = 320,
        render_height: int = 240,
        camera_id: int | str | None = None,
        dtype: torch.dtype = torch.float32,
        requires_grad: bool = False,
        site_names: tuple[str, ...] = (),
        contact_geom_names: tuple[str, ...] = (),
        **backend_kwargs,
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be an integer >= 1, got {num_envs!r}.")
        if not math.isfinite(reset_noise_scale) or reset_noise_scale < 0:
            raise ValueError(f"reset_noise_scale must be finite and >= 0, got {reset_noise_scale!r}.")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}.")
        for name, value in (("render_width", render_width), ("render_height", render_height)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        device = torch.device(device)
        backend = default_backend(device, spec) if backend is None else backend
        if backend not in BACKENDS:
            raise ValueError(f"Unknown backend {backend!r}; choose one of {sorted(BACKENDS)}.")
        super().__init__(device=device, batch_size=torch.Size([num_envs]))
        self.num_envs = num_envs
        self.dtype = dtype
        self.reset_noise_scale = float(reset_noise_scale)
        self.from_pixels = bool(from_pixels)
        self.render_width = render_width
        self.render_height = render_height
        self.camera_id = camera_id
        self.physics: PhysicsBackend = make_backend(
            backend,
            spec,
            num_envs=num_envs,
            frame_skip=frame_skip,
            site_names=site_names,
            contact_geom_names=contact_geom_names,
            device=device,
            dtype=dtype,
            requires_grad=requires_grad,
            **backend_kwargs,
        )
        self.backend = backend
        self.requires_grad = bool(requires_grad)
        self.rng = torch.Generator(device=device)
        if seed is not None:
            self.set_seed(seed)
        self._renderer = None

    @property
    def model(self) -> mujoco.MjModel:
        return self.physics.model

    @property
    def control_dt(self) -> float:
        """Simulated seconds per env step."""
        return self.physics.control_dt

    def _set_seed(self, seed: int | None) -> None:
        if seed is None:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
        self.rng.manual_seed(int(seed))

    def get_state(self) -> TensorDict:
        """A detached snapshot of the simulator state: ``qpos``, ``qvel`` and ``time``."""
        return TensorDict(
            {
                "qpos": self.physics.qpos.detach().clone(),
                "qvel": self.physics.qvel.detach().clone(),
                "time": self.physics.time.detach().clone(),
            },
            batch_size=self.batch_size,
            device=self.device,
        )

    def detach_state(self) -> None:
        """Cut the autograd history carried by the simulator state.

        The next step's outputs depend on the current state only as a constant,
        which starts a new truncated back-propagation segment.
        """
        self.physics.detach()

    def render(
        self,
        *,
        width: int | None = None,
        height: int | None = None,
        camera_id: int | str | None = None,
    ) -> torch.Tensor:
        """Render every env to an ``(num_envs, H, W, 3)`` uint8 tensor.

        Defaults come from the constructor's ``render_width``,
        ``render_height`` and ``camera_id``.
        """
        from waddle.physics.render import BatchRenderer

        width = self.render_width if width is None else width
        height = self.render_height if height is None else height
        camera = self.camera_id if camera_id is None else camera_id
        if self._renderer is None or self._renderer.size != (width, height):
            if self._renderer is not None:
                self._renderer.close()
            self._renderer = BatchRenderer(self.model, width=width, height=height)
        frames = self._renderer.render(self.physics.qpos.detach(), camera=camera)
        return frames.to(self.device)

    def close(self, *, raise_if_closed: bool = True) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self.physics.close()
        super().close(raise_if_closed=raise_if_closed)

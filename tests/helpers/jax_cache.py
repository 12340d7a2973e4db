"""JAX's persistent compilation cache for test modules that compile JAX programs.

Compiling a Brax or MJX step takes from tens of seconds to minutes on a
2-core CPU; the cache makes every run after the first one quick. Its folder is
``$WADDLE_JAX_CACHE`` (default ``~/.cache/waddle/jax``; ``0`` or empty
disables it).
"""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def persistent_compilation_cache():
    """Turn the cache on for the duration of the block, then restore JAX's settings."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    path = os.environ.get("WADDLE_JAX_CACHE", os.path.expanduser("~/.cache/waddle/jax"))
    if path in ("", "0"):
        yield
        return
    old = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.0)
    # JAX decides once per process whether the cache is on; make it look again
    # (here, and after restoring the settings for the tests that follow).
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_compilation_cache_dir", old[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", old[1])
        compilation_cache.reset_cache()

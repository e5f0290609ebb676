"""chorus as a torch.distributed backend.

    import chorus_torch                      # registers the backend "chorus"
    torch.distributed.init_process_group("chorus")

Every c10d operation runs as chorus collectives (see README, "Use from PyTorch"). Importing
twice is harmless. `python3 -m chorus_torch script.py ...` runs a script that does not import
chorus_torch itself, with the backend registered (for launchers: torchrun -m chorus_torch ...).
"""
import inspect

import torch
import torch.distributed as dist

from . import _C

__all__ = ["BACKEND", "register", "chorus_version"]

BACKEND = "chorus"
chorus_version = _C.chorus_version


def _create(store, rank, size, timeout):
    return _C.create_process_group(store, rank, size, timeout)


def register():
    """Registers backend "chorus" with torch.distributed, once per process."""
    backend = dist.Backend
    if BACKEND.upper() in getattr(backend, "_plugins", {}):
        return
    kwargs = {}
    if "devices" in inspect.signature(backend.register_backend).parameters:
        kwargs["devices"] = ["cpu"]  # torch 2.x: barrier() and *_object calls use CPU tensors
    backend.register_backend(BACKEND, _create, **kwargs)


register()

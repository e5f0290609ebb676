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

__all__ = ["BACKEND", "register", "chorus_version", "revoke", "shrink"]

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


def _chorus_group(group):
    group = group if group is not None else dist.distributed_c10d._get_default_group()
    if not str(_C.torch_version_built).startswith("1."):
        raise NotImplementedError("chorus_torch.revoke/shrink are built for torch 1.x only so far "
                                  "(torch 2.x wraps backends in groups; not built or tested yet)")
    return group


def revoke(group=None):
    """Every pending and later operation of the group (default: the world) fails, on every rank
    -- its Work raises RuntimeError "... revoked ..." -- within milliseconds of one rank's call
    (chorusCommRevoke). The group stays valid for shrink."""
    _C.revoke(_chorus_group(group))


def shrink(group=None, exclude=None):
    """A new group of the survivors of `group` (default: the world), numbered in the old order
    (chorusCommShrink). Without `exclude`, the survivors find the dead ranks and agree on them
    themselves (CHORUS_SHRINK_AGREE), also when a rank dies during the agreement or the rank that
    hosted the bootstrap store is among the dead; with it, every survivor passes the same list.
    The new group is used like any other: dist.all_reduce(t, group=g), DDP(model,
    process_group=g), g.rank(), g.size() (it is not in torch's group registry, so not
    dist.get_rank(g))."""
    ex = sorted(exclude) if exclude is not None else []
    return _C.shrink(_chorus_group(group), ex, exclude is None)


register()

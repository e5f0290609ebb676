"""Prints what the build needs of the installed torch: version, include dirs (;-joined), library
dir, and _GLIBCXX_USE_CXX11_ABI. Exits non-zero with the reason when torch is unusable."""
import os
import sys

try:
    import torch
    from torch.utils import cpp_extension
except Exception as e:  # noqa: BLE001 - any failure means: no torch to build against
    sys.exit(f"cannot import torch with {sys.executable}: {e}")

print(torch.__version__)
print(";".join(p for p in cpp_extension.include_paths() if os.path.isdir(p)))
print(cpp_extension.library_paths()[0])
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))

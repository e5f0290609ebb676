"""python3 -m chorus_torch script.py [args]: run a script with backend "chorus" registered.

For launchers and scripts that cannot add `import chorus_torch`:
    chorus-run -n 2 /usr/bin/python3 -m chorus_torch train.py
    torchrun --nproc_per_node 2 -m chorus_torch train.py
"""
import runpy
import sys

import chorus_torch  # noqa: F401  (registers the backend)

if len(sys.argv) < 2:
    sys.exit("usage: python3 -m chorus_torch script.py [args...]")
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")

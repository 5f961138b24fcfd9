"""python -m tightfit.engine.kernels [-v]: build the fused decode kernels now (scripts/setup.sh)."""
import logging
import sys

from tightfit.engine.kernels import build_dir, load, why_not

logging.basicConfig(level=logging.INFO)
if load(verbose="-v" in sys.argv):
    print(f"tightfit: fused decode kernels ready in {build_dir()}")
else:
    print(f"tightfit: fused decode kernels not built ({why_not()}); decode will use the "
          "plain TorchScript stack")

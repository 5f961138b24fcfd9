"""`python -m tightfit.lite`: builds the lite runtime's library for this machine (setup runs it)
and says where it is; a failed build prints why and exits 0, since the torch engine needs none
of it."""
from __future__ import annotations

import sys

from tightfit.errors import TightfitError
from tightfit.lite.runtime import SIMD, library, library_path


def main() -> int:
    try:
        lib = library()
    except (TightfitError, OSError) as exc:
        print(f"tightfit lite runtime not built ({exc}); `--runtime lite` will say so again",
              file=sys.stderr)
        return 0
    print(f"tightfit lite runtime: {library_path()} ({SIMD[lib.tf_simd()]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

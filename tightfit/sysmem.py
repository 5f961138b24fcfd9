"""Peak resident memory of this process, read the way that survives how it was started.

`getrusage().ru_maxrss` is preserved across exec: a child started by fork/vfork + exec from a
parent that already held the model reports at least the parent's peak. On Linux the kernel's
per-address-space high-water mark (`VmHWM` in /proc/self/status) starts afresh at exec, so it
is used there; elsewhere ru_maxrss is the fallback."""
from __future__ import annotations

import resource
import sys

_STATUS = "/proc/self/status"


def peak_rss_bytes(pid: int | None = None) -> int:
    """This process's peak RSS, or another process's (`pid`: Linux only, e.g. a server child)."""
    try:
        with open(_STATUS if pid is None else f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        if pid is not None:
            return 0
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024  # macOS: bytes; Linux: KiB


def peak_rss_mib(pid: int | None = None) -> float:
    return peak_rss_bytes(pid) / 2**20


def reset_peak_rss() -> bool:
    """Restarts the high-water mark at the current RSS (Linux: clear_refs 5); False if this
    platform cannot, in which case peaks cover the whole process life."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False

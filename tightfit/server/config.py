"""`ServerConfig`: the HTTP server's own settings (bind address, access, limits), frozen and
validated once. Engine settings (model, KV pool, batch size) live in tightfit.config."""
from __future__ import annotations

from dataclasses import dataclass

from tightfit.errors import TightfitError

API_KEY_ENV = "TIGHTFIT_API_KEY"


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    """Address to bind; 127.0.0.1 keeps the server private to this machine."""
    port: int = 8000
    """TCP port (0 = any free port)."""
    api_key: str | None = None
    """When set, every endpoint but /health needs `Authorization: Bearer <key>`."""
    max_queue: int = 256
    """Requests (sequences) that may wait beyond the engine's running batch; more get 429."""
    max_body_bytes: int = 1 << 20
    """Request bodies larger than this get 413."""
    model_name: str | None = None
    """Name served in /v1/models and accepted in `model` (default: the model file's name)."""
    max_n: int = 16
    """Largest `n` (choices per request) accepted."""
    retry_after_s: int = 1
    """Value of the Retry-After header sent with 429."""
    drain_timeout_s: float = 30.0
    """On shutdown (SIGTERM), how long in-flight requests may take to finish."""
    monitor_interval_s: float = 1.0
    """Seconds between samples of process and device resources."""
    access_log: bool = False
    """Log one line per HTTP request."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise TightfitError(f"port must be in 0..65535, got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise TightfitError("api_key is empty: give a non-empty key or none at all")
        for name in ("max_queue",):
            if getattr(self, name) < 0:
                raise TightfitError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_body_bytes", "max_n", "retry_after_s"):
            if getattr(self, name) < 1:
                raise TightfitError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("drain_timeout_s", "monitor_interval_s"):
            if not getattr(self, name) > 0:
                raise TightfitError(f"{name} must be > 0, got {getattr(self, name)}")

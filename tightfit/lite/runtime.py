"""tightfit lite: the GGUF's own weights served from a process that never imports torch.

Why: `import torch` alone holds ~217 MiB resident here, more than twice the default model's
weights; the lite runtime's process holds the interpreter, numpy, the tokenizer, the weights (the
file's memory map, read in place) and the K/V it has written. `lite.c` is the forward pass (see
its header); this module builds it once per machine with the system C compiler (cached like
the decode kernels, under `TIGHTFIT_CACHE`), points it at the GGUF tensors, and runs prompts:
the scheduler on top is tightfit.lite.engine.

Scope: llama-architecture GGUF files (SmolLM2, Llama, TinyLlama, ...) with tensors in F32, F16,
Q4_0, Q4_1 or Q8_0; anything else gets an error naming what is unsupported. The torch engine
(tightfit.engine) remains the full-featured one: other architectures and formats, the paged
memory pool, KV compression, the server.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tightfit.buildcache import cache_root, cpu_key
from tightfit.config import default_threads
from tightfit.errors import RequestError, TightfitError, UnsupportedModelError

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("lite.c")
TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 8: "Q8_0"}  # GGML type id -> name
SIMD = ("plain C", "avx2", "avx512-vnni")  # what tf_simd() returns, by value
_SLOTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
          "attn_norm", "ffn_norm")
_ERRORS = {-1: "a token id or output row out of range", -2: "a position beyond the context",
           -3: "a sequence slot out of range", -4: "out of memory for the call's scratch"}
_libs: dict[str, ctypes.CDLL] = {}


def _march(march: str | None) -> str:
    """-march for the build: the argument, else TIGHTFIT_LITE_MARCH, else native."""
    return os.environ.get("TIGHTFIT_LITE_MARCH", "native") if march is None else march


def _flags(march: str) -> list[str]:
    return ["-O3", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared", "-std=c11"] + (
        [f"-march={march}"] if march else [])


def library_path(march: str | None = None) -> Path:
    """One file per (CPU, source, flags), shared by checkouts with the same source."""
    march = _march(march)
    src = hashlib.sha1(SOURCE.read_bytes() + " ".join(_flags(march)).encode()).hexdigest()[:12]
    return cache_root() / "lite" / f"{cpu_key()}-{src}" / "libtightfit_lite.so"


def build(march: str | None = None) -> Path:
    """Compiles lite.c (first time; ~2 s) and returns the library's path."""
    march = _march(march)
    path = library_path(march)
    if path.exists():
        return path
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise TightfitError(f"the lite runtime needs a C compiler: {cc!r} is not on PATH "
                            "(install gcc, or set CC)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    cmd = [cc, *_flags(march), str(SOURCE), "-o", str(tmp), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise TightfitError(f"building the lite runtime failed ({' '.join(cmd)}):\n{tail}")
    os.replace(tmp, path)  # atomic: a concurrent loader sees the whole library or none
    return path


def library(march: str | None = None) -> ctypes.CDLL:
    """The built library, loaded once per path, with its functions' signatures set."""
    path = str(build(march))
    if path in _libs:
        return _libs[path]
    lib = ctypes.CDLL(path)
    P, I, F = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)
    I32 = ctypes.POINTER(ctypes.c_int32)
    lib.tf_model_new.argtypes = [ctypes.POINTER(ctypes.c_int), F]
    lib.tf_model_new.restype = P
    lib.tf_model_free.argtypes = [P]
    lib.tf_seq_release.argtypes = [P, I]
    lib.tf_set_tensor.argtypes = [P, I, I, I, I, I, P]
    lib.tf_set_tensor.restype = I
    lib.tf_kv_bytes_per_token.argtypes = [P]
    lib.tf_kv_bytes_per_token.restype = ctypes.c_size_t
    lib.tf_simd.restype = I
    lib.tf_forward.argtypes = [P, I, I32, I32, I32, I, I32, F, I]
    lib.tf_forward.restype = I
    lib.tf_linear.argtypes = [I, I, I, P, I, F, F, I]
    lib.tf_linear.restype = I
    _libs[path] = lib
    return lib


def _i32(values: Sequence[int]) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int32)


def _ptr(a: np.ndarray, kind: type = ctypes.c_int32) -> ctypes._Pointer:  # type: ignore[type-arg]
    return a.ctypes.data_as(ctypes.POINTER(kind))


class LiteModel:
    """A llama-architecture GGUF model in the lite runtime: weights in place in the file's
    memory map, and `max_num_seqs` sequence slots of `max_model_len` positions of K/V each (half
    floats; address space only until written). The scheduler is tightfit.lite.engine."""

    _handle = None

    def __init__(self, model: str | Path | None = None, *, threads: int | None = None,
                 max_model_len: int = 2048, max_num_seqs: int = 1,
                 march: str | None = None) -> None:
        from tightfit.engine.loader.gguf import GGUFFile
        from tightfit.engine.loader.resolve import resolve_model
        from tightfit.engine.tokenizer import Tokenizer

        if not isinstance(max_model_len, int) or max_model_len < 1:
            raise TightfitError(f"max_model_len must be an integer >= 1, got {max_model_len!r}")
        if not isinstance(max_num_seqs, int) or max_num_seqs < 1:
            raise TightfitError(f"max_num_seqs must be an integer >= 1, got {max_num_seqs!r}")
        self.threads = threads or default_threads()
        if not isinstance(self.threads, int) or self.threads < 1:
            raise TightfitError(f"threads must be an integer >= 1, got {threads!r}")
        path = resolve_model(model)
        if path.is_dir():
            raise UnsupportedModelError(f"the lite runtime reads GGUF files; {str(path)!r} is a "
                                        "directory (use the torch engine for safetensors)")
        t0 = time.perf_counter()
        self.lib = library(march)
        self.gguf = GGUFFile(path)
        arch = self.gguf.architecture
        if arch != "llama":
            raise UnsupportedModelError(
                f"the lite runtime runs llama-architecture GGUF files; {path.name} is {arch!r} "
                "(run it on the torch engine: drop --runtime lite)")
        if self.gguf.arch_get("rope.scaling.type", "none") not in ("none", None):
            raise UnsupportedModelError(
                f"{path.name} uses rope scaling {self.gguf.arch_get('rope.scaling.type')!r}, "
                "which the lite runtime does not implement")
        tensors = {t.name: t for t in self.gguf.tensors()}
        g = self.gguf.arch_get
        n_head = int(g("attention.head_count"))
        d_model = int(g("embedding_length"))
        self.dims = dict(
            n_layer=int(g("block_count")), d_model=d_model, n_head=n_head,
            n_kv=int(g("attention.head_count_kv", n_head)),
            head_dim=int(g("attention.key_length", d_model // n_head)),
            d_ff=int(g("feed_forward_length")), vocab=int(tensors["token_embd.weight"].shape[0]),
            n_ctx=max_model_len, n_seq=max_num_seqs)
        trained = g("context_length")
        if trained and max_model_len > int(trained):
            raise TightfitError(f"max_model_len {max_model_len} exceeds the model's context "
                                f"length {trained}; use at most {trained}")
        dims = (ctypes.c_int * 9)(*self.dims.values())
        fparams = (ctypes.c_float * 2)(float(g("attention.layer_norm_rms_epsilon", 1e-5)),
                                       float(g("rope.freq_base", 10000.0)))
        handle = self.lib.tf_model_new(dims, fparams)
        if not handle:
            kv = self.dims["n_layer"] * 2 * self.dims["n_kv"] * self.dims["head_dim"] * 4
            raise TightfitError(
                f"cannot reserve K/V for {max_num_seqs} sequences x {max_model_len} positions "
                f"({max_num_seqs * max_model_len * kv / 2**30:.1f} GiB of address space); "
                "lower max_num_seqs or max_model_len")
        self._handle = handle
        self._set(-1, 0, tensors, "token_embd.weight")
        self._set(-1, 1, tensors, "output.weight" if "output.weight" in tensors
                  else "token_embd.weight")  # tied embeddings
        self._set(-1, 2, tensors, "output_norm.weight")
        for layer in range(self.dims["n_layer"]):
            for slot, name in enumerate(_SLOTS):
                self._set(layer, slot, tensors, f"blk.{layer}.{name}.weight")
        self.tokenizer = Tokenizer.from_gguf(self.gguf)
        self.path = path
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.vocab_size = self.dims["vocab"]
        self.load_time_s = time.perf_counter() - t0

    def _set(self, layer: int, slot: int, tensors: dict, name: str) -> None:
        t = tensors.get(name)
        if t is None:
            raise UnsupportedModelError(f"{self.gguf.path.name} has no tensor {name!r}, which a "
                                        "llama-architecture model needs")
        kind = int(t.qtype)
        if kind not in TYPES:
            raise UnsupportedModelError(
                f"tensor {name!r} of {self.gguf.path.name} is {t.qtype.name}; the lite runtime "
                f"reads {', '.join(TYPES.values())} (use the torch engine for this file)")
        if (slot >= 7 or (layer < 0 and slot == 2)) and kind != 0:
            raise UnsupportedModelError(f"norm tensor {name!r} is {t.qtype.name}, expected F32")
        rows, cols = (t.shape if len(t.shape) == 2 else (1, t.shape[0]))
        if self.lib.tf_set_tensor(self._handle, layer, slot, kind, rows, cols,
                                  t.data.ctypes.data) != 0:
            raise UnsupportedModelError(f"tensor {name!r} ({t.qtype.name}, {rows} x {cols}) "
                                        "cannot be used: its rows are not whole 32-value blocks")

    def close(self) -> None:
        if getattr(self, "_handle", None):
            self.lib.tf_model_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()

    @property
    def simd(self) -> str:
        return SIMD[self.lib.tf_simd()]

    def release(self, slot: int) -> None:
        """Hands a finished sequence's K/V pages back to the system."""
        if self._handle:
            self.lib.tf_seq_release(self._handle, slot)

    def kv_bytes_per_token(self) -> int:
        return int(self.lib.tf_kv_bytes_per_token(self._handle))

    # -- one forward call ------------------------------------------------------------------

    def forward(self, tokens: Sequence[int], seqs: Sequence[int], positions: Sequence[int],
                out_rows: Sequence[int]) -> np.ndarray:
        """Runs the tokens (each at its sequence slot and position) and returns the logits of
        the rows in `out_rows`, shape [len(out_rows), vocab]."""
        if not self._handle:
            raise TightfitError("this LiteModel was closed")
        tok, seq, pos, rows = _i32(tokens), _i32(seqs), _i32(positions), _i32(out_rows)
        if not (len(tok) == len(seq) == len(pos)) or len(tok) == 0:
            raise RequestError("tokens, seqs and positions must be equally long and non-empty")
        bad = tok[(tok < 0) | (tok >= self.vocab_size)]
        if bad.size:
            raise RequestError(f"token id {int(bad[0])} is outside the vocabulary "
                               f"(0..{self.vocab_size - 1})")
        if int(pos.max()) >= self.max_model_len or int(pos.min()) < 0:
            raise RequestError(f"position {int(pos.max())} is beyond max_model_len "
                               f"{self.max_model_len}")
        logits = np.empty((len(rows), self.vocab_size), dtype=np.float32)
        rc = self.lib.tf_forward(self._handle, len(tok), _ptr(tok), _ptr(seq), _ptr(pos),
                                 len(rows), _ptr(rows), _ptr(logits, ctypes.c_float),
                                 self.threads)
        if rc != 0:
            raise TightfitError(f"lite forward failed: {_ERRORS.get(rc, rc)}")
        return logits

"""The GGUF reader the engine loads from; it lives in `tightfit.gguf_file` (torch-free), where
the predictor reads a file's header with it too."""
from tightfit.gguf_file import GGUFFile, GGUFTensor

__all__ = ["GGUFFile", "GGUFTensor"]

"""tightfit's quantised model file (`.tfq`): written by `tightfit quantize`, loaded directly by the
engine (`LLM(model="model.tfq")`) with no calibration or re-quantisation at load.

Layout: one safetensors file. Its metadata key "tightfit" holds a JSON header:
    format/version, config (the ModelConfig), quant (the plan's name or file), plan (its content),
    source {path, sha256 of the original model file}, tokenizer (see below), embedding {kind,
    qtype}, modules {key: spec}, payload_sha256 (over every tensor, in name order).
Tensors: the embedding (GGUF blocks as uint8 `embed_tokens.rows`, or fp32 `embed_tokens.weight`);
every norm under its HF name (`layers.3.input_layernorm.weight`, fp32, AWQ scales folded in);
per projection module `<key>.*`: int4 -> `codes` (two 4-bit codes per byte, low nibble first,
[out, in_padded / 2]) + `scales` + `zeros` ([out, in_padded / group], stored in the kernel's
dtype); int8 -> `q` + `scales`; fp32 -> `weight`; any -> optional `bias`, `input_scale_inv` (AWQ
scales divided out at run time). Modules whose projections run side by side (SplitLinear) store
`<key>.part<j>.*`. Module keys are the projection names they compute, joined by '+'.
Tokenizer: a GGUF source's `tokenizer.*` metadata is copied into the header (the file stands
alone); an HF-directory source is referenced by path (the directory must stay in place).

Loading checks the header, every shape and the payload hash: a damaged or truncated file raises
ModelFileError naming the file. Packed int4 layouts depend on the CPU, so codes (not packed
bytes) are stored and re-packed at load (~1 s on the default model).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tightfit.config import ModelConfig
from tightfit.errors import ModelFileError, TightfitError

FORMAT = "tightfit-quantized"
VERSION = 1
SUFFIX = ".tfq"
_PROJ_ATTRS = {"attn.qkv": ("q_proj", "k_proj", "v_proj"), "attn.o": ("o_proj",),
               "mlp.gate_up": ("gate_proj", "up_proj"), "mlp.down": ("down_proj",)}


# -- saving ----------------------------------------------------------------------------------

def save_quantized(loaded: Any, out_path: str | Path) -> Path:
    """Writes `loaded` (a model_loader.LoadedModel) as a .tfq file; returns the path."""
    from safetensors.torch import save_file

    out = Path(out_path)
    net, cfg = loaded.model, loaded.config
    tensors: dict[str, torch.Tensor] = {}
    modules: dict[str, Any] = {}
    for names, module in _projection_modules(net, cfg):
        key = "+".join(names)
        modules[key] = _export_module(module, names, key, tensors)
    tensors.update(_norm_tensors(net, cfg))
    embedding = _export_embedding(net.embed, tensors)
    header = {
        "format": FORMAT, "version": VERSION, "config": asdict(cfg),
        "quant": loaded.weight_format, "plan": _plan_spec(loaded.weight_format),
        "source": _source_info(Path(loaded.path)),
        "tokenizer": _tokenizer_source(Path(loaded.path)),
        "embedding": embedding, "modules": modules,
        "payload_sha256": _payload_digest(tensors),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(_unshared(tensors), str(out), metadata={"tightfit": json.dumps(header)})
    return out


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous tensors with no memory in common (safetensors refuses shared storage, e.g. an
    fp32 embedding tied to an fp32 head): later sharers get a copy."""
    seen: set[int] = set()
    out = {}
    for name, t in tensors.items():
        t = t.contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


def _projection_modules(net: nn.Module, cfg: ModelConfig) -> list[tuple[list[str], nn.Module]]:
    """(projection names, module) for every linear of the model, as the LinearFactory saw them."""
    found = []
    for i, layer in enumerate(net.layers):
        for attr, projs in _PROJ_ATTRS.items():
            found.append(([f"layers.{i}.{p}" for p in projs], layer.get_submodule(attr)))
    found.append((["lm_head"], net.lm_head))
    return found


def _export_module(module: nn.Module, names: list[str], key: str,
                   tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    from tightfit.engine.quant.linear import Int4Linear, Int8Linear
    from tightfit.engine.quant.plan import SplitLinear

    spec: dict[str, Any] = {"names": names}
    if isinstance(module, SplitLinear):
        spec["kind"] = "split"
        spec["parts"] = [_export_module(p, [n], f"{key}.part{j}", tensors)
                         for j, (n, p) in enumerate(zip(names, module.parts))]
        return spec
    if isinstance(module, Int4Linear):
        spec.update(kind="int4", group_size=module.group_size, in_features=module.in_features,
                    compute=module.compute)
        sz_dtype = module.scales_and_zeros.dtype
        tensors[f"{key}.codes"] = _pack_nibbles(module.codes())
        tensors[f"{key}.scales"] = module.scales.to(sz_dtype)
        tensors[f"{key}.zeros"] = module.zeros.to(sz_dtype)
    elif isinstance(module, Int8Linear):
        spec.update(kind="int8", compute=module.compute)
        tensors[f"{key}.q"] = module.codes()
        tensors[f"{key}.scales"] = module.scales
    elif isinstance(getattr(module, "weight", None), torch.Tensor):  # nn.Linear, DenseLinear
        spec["kind"] = "fp32"
        tensors[f"{key}.weight"] = module.weight.detach().to(torch.float32)
    else:
        raise TightfitError(f"cannot export projection module {type(module).__name__} "
                            f"({', '.join(names)})")
    for buf in ("bias", "input_scale_inv"):
        value = getattr(module, buf, None)
        if isinstance(value, torch.Tensor):
            tensors[f"{key}.{buf}"] = value.detach().to(torch.float32)
    return spec


def _norm_names(net: nn.Module, cfg: ModelConfig) -> dict[str, nn.Module]:
    """HF weight name -> the RMSNorm module holding it (the inverse of DecoderModel's pops)."""
    out: dict[str, nn.Module] = {"norm.weight": net.norm}
    for i, layer in enumerate(net.layers):
        p = f"layers.{i}."
        out[p + "input_layernorm.weight"] = layer.attn_norm
        if layer.attn.q_norm is not None:
            out[p + "self_attn.q_norm.weight"] = layer.attn.q_norm
            out[p + "self_attn.k_norm.weight"] = layer.attn.k_norm
        if cfg.sandwich_norm:
            out[p + "post_attention_layernorm.weight"] = layer.post_attn_norm
            out[p + "pre_feedforward_layernorm.weight"] = layer.ffn_norm
            out[p + "post_feedforward_layernorm.weight"] = layer.post_ffn_norm
        else:
            out[p + "post_attention_layernorm.weight"] = layer.ffn_norm
    return out


def _norm_tensors(net: nn.Module, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    return {name: m.weight.detach().to(torch.float32).clone()
            for name, m in _norm_names(net, cfg).items()}


def _export_embedding(embed: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    from tightfit.engine.quant.embedding import QuantizedEmbedding

    if isinstance(embed, QuantizedEmbedding):
        tensors["embed_tokens.rows"] = embed.rows
        return {"kind": "gguf", "qtype": embed.qtype.name,
                "shape": [embed.num_embeddings, embed.embedding_dim]}
    tensors["embed_tokens.weight"] = embed.weight.detach().to(torch.float32)
    return {"kind": "fp32"}


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [n, k] (0..15, k even) -> [n, k / 2], low nibble = even column."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 0x0F, packed >> 4], dim=2).reshape(packed.shape[0], -1)


def _plan_spec(quant: str) -> str:
    from tightfit.engine.quant.awq_cache import plan_spec
    from tightfit.engine.quant.plan import PrecisionPlan

    return plan_spec(PrecisionPlan.parse(quant))


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _source_info(path: Path) -> dict[str, Any]:
    return {"path": str(path.resolve()),
            "sha256": _file_sha256(path) if path.is_file() else None}


def _tokenizer_source(path: Path) -> dict[str, Any]:
    if path.suffix == SUFFIX:  # re-saving a loaded .tfq: keep its tokenizer source
        return _header_only(path)["tokenizer"]
    if path.is_dir():
        return {"kind": "hf-dir", "path": str(path.resolve())}
    from tightfit.engine.loader.gguf import GGUFFile

    g = GGUFFile(path)
    meta = {k: v for k, v in g.metadata.items() if k.startswith("tokenizer.")}
    return {"kind": "gguf-metadata", "architecture": g.architecture, "metadata": meta}


def _payload_digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(memoryview(t.view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)))
    return h.hexdigest()


# -- loading ---------------------------------------------------------------------------------

def load_quantized(path: str | Path, quant: str | Path | None = None
                   ) -> tuple[nn.Module, ModelConfig, Any, str]:
    """(DecoderModel, ModelConfig, Tokenizer, quant name) from a .tfq file.

    `quant`: None, "fp32" or "native" (the engine's defaults: take the file as it is) or the
    file's own quant name; anything else raises, since the file is already quantised."""
    path = Path(path)
    header, tensors = _read(path)
    stored = str(header.get("quant", ""))
    if quant is not None and str(quant) not in ("fp32", "native", stored):
        raise TightfitError(f"{str(path)!r} is already quantised as {stored!r}; load it without "
                            f"a weight format (got {str(quant)!r})")
    try:
        cfg = _config(header["config"])
        model = _build_model(cfg, header, tensors)
        tokenizer = _tokenizer(header["tokenizer"], path)
    except ModelFileError:
        raise
    except (TightfitError, KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ModelFileError(f"{str(path)!r} is not a valid tightfit quantised file "
                             f"({type(exc).__name__}: {exc})") from exc
    return model, cfg, tokenizer, stored


def _read(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from safetensors import safe_open

    if not path.is_file():
        raise ModelFileError(f"quantised model file {str(path)!r} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            # clone: tensors read from the file can sit at any byte offset, and the int8 kernel
            # crashes on data that is not 64-byte aligned (measured); fresh allocations are.
            tensors = {k: f.get_tensor(k).clone() for k in f.keys()}
        header = json.loads(meta["tightfit"])
    except Exception as exc:  # safetensors raises its own error types for truncated files
        raise ModelFileError(f"{str(path)!r} is not a readable tightfit quantised file "
                             f"({type(exc).__name__}: {exc}); it may be truncated or corrupt; "
                             "re-create it with `tightfit quantize`") from exc
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ModelFileError(f"{str(path)!r} is not a tightfit quantised file of version "
                             f"{VERSION} (format {header.get('format')!r}, version "
                             f"{header.get('version')!r})")
    if _payload_digest(tensors) != header.get("payload_sha256"):
        raise ModelFileError(f"{str(path)!r} is corrupt: its tensors do not match the checksum "
                             "in its header; re-create it with `tightfit quantize`")
    return header, tensors


def _header_only(path: Path) -> dict[str, Any]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return json.loads((f.metadata() or {})["tightfit"])
    except Exception as exc:
        raise ModelFileError(f"{str(path)!r} is not a readable tightfit quantised file "
                             f"({type(exc).__name__}: {exc})") from exc


def _config(data: dict[str, Any]) -> ModelConfig:
    known = {f.name for f in fields(ModelConfig)}
    # JSON turned tuples into lists; the frozen config must stay hashable.
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known}
    return ModelConfig(**values)


def _build_model(cfg: ModelConfig, header: dict[str, Any], tensors: dict[str, torch.Tensor]
                 ) -> nn.Module:
    from tightfit.engine.models.transformer import DecoderModel

    modules = {tuple(spec["names"]): _import_module(spec, key, tensors)
               for key, spec in header["modules"].items()}
    weights: dict[str, Any] = {"embed_tokens.weight": _import_embedding(header["embedding"],
                                                                         tensors)}
    weights.update({k: v for k, v in tensors.items() if k.endswith("norm.weight")})
    for i in range(cfg.num_layers):  # placeholders: the modules are already built
        for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
            weights[f"layers.{i}.self_attn.{p}.weight"] = None
            if cfg.qkv_bias and p != "o_proj":
                weights[f"layers.{i}.self_attn.{p}.bias"] = None
        for p in ("gate_proj", "up_proj", "down_proj"):
            weights[f"layers.{i}.mlp.{p}.weight"] = None

    def factory(names: list[str], _weights: Any, _biases: Any) -> nn.Module:
        if tuple(names) not in modules:
            raise ModelFileError(f"the file has no module for {'+'.join(names)}")
        return modules.pop(tuple(names))

    return DecoderModel(cfg, weights, factory)


def _tensor(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in tensors:
        raise ModelFileError(f"tensor {name!r} is missing")
    return tensors[name]


def _import_module(spec: dict[str, Any], key: str, tensors: dict[str, torch.Tensor]
                   ) -> nn.Module:
    from tightfit.engine.quant.linear import Int4Linear, Int8Linear, fp32_linear
    from tightfit.engine.quant.plan import SplitLinear
    from tightfit.engine.quant.reference import Int4Weights

    kind = spec["kind"]
    if kind == "split":
        return SplitLinear([_import_module(p, f"{key}.part{j}", tensors)
                            for j, p in enumerate(spec["parts"])])
    bias = tensors.get(f"{key}.bias")
    inv = tensors.get(f"{key}.input_scale_inv")
    scale = None if inv is None else 1.0 / inv
    if kind == "int4":
        codes = _unpack_nibbles(_tensor(tensors, f"{key}.codes"))
        qw = Int4Weights(codes=codes, scales=_tensor(tensors, f"{key}.scales").float(),
                         zeros=_tensor(tensors, f"{key}.zeros").float(),
                         group_size=int(spec["group_size"]), in_features=int(spec["in_features"]))
        module: nn.Module = Int4Linear.from_weights(qw, bias, scale, compute=spec["compute"])
    elif kind == "int8":
        # the kernel is this machine's choice (int8x2 where fbgemm runs), not the file's: the
        # stored codes and scales are the same for every int8 kernel
        module = Int8Linear(_tensor(tensors, f"{key}.q"), _tensor(tensors, f"{key}.scales").float(),
                            bias, scale)
    elif kind == "fp32":
        return fp32_linear(_tensor(tensors, f"{key}.weight"), bias)
    else:
        raise ModelFileError(f"unknown module kind {kind!r} for {key}")
    if inv is not None:  # the exact stored 1/s, not 1 / (1 / inv) re-rounded
        module.input_scale_inv.copy_(inv)
    return module


def _import_embedding(spec: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
    if spec["kind"] == "fp32":
        return _tensor(tensors, "embed_tokens.weight")
    import gguf

    from tightfit.engine.loader.gguf import GGUFTensor
    from tightfit.engine.loader.weights import NativeTensor

    rows = _tensor(tensors, "embed_tokens.rows").numpy()
    shape = tuple(int(d) for d in spec["shape"])
    qtype = gguf.GGMLQuantizationType[spec["qtype"]]
    return NativeTensor(GGUFTensor("token_embd.weight", qtype, shape, rows), None)


class _TokenizerMetadata:
    """The slice of GGUFFile that Tokenizer.from_gguf reads, rebuilt from the copied metadata."""

    def __init__(self, path: Path, architecture: str, metadata: dict[str, Any]) -> None:
        self.path = path
        self.architecture = architecture
        self.metadata = {"general.architecture": architecture, **metadata}

    def array(self, key: str) -> list[Any] | None:
        return self.metadata.get(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)


def _tokenizer(spec: dict[str, Any], path: Path) -> Any:
    from tightfit.engine.tokenizer import Tokenizer

    if spec["kind"] == "gguf-metadata":
        return Tokenizer.from_gguf(_TokenizerMetadata(path, spec["architecture"],
                                                      spec["metadata"]))  # type: ignore[arg-type]
    source = Path(spec["path"])
    if not source.is_dir():
        raise ModelFileError(f"{str(path)!r} takes its tokenizer from {str(source)!r}, which no "
                             "longer exists")
    return Tokenizer.from_pretrained_dir(source)

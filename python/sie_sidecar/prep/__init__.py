# SPDX-License-Identifier: Apache-2.0
"""GPU-independent preparation the sidecar does before IPC: text tokenization (scheduler §6)."""

from __future__ import annotations

from .text import apply_template, eligible_text, render_template, resolve_templates, transform_text
from .tokenize import (
    DEFAULT_MAX_SEQ_LEN,
    PreparedTokens,
    RegisteredTokenizer,
    TokenizerRegistry,
    effective_max_seq_len,
    encode_cost,
    prepare_encode_batch,
    tokenizer_id_of,
)

__all__ = [
    "DEFAULT_MAX_SEQ_LEN",
    "PreparedTokens",
    "RegisteredTokenizer",
    "TokenizerRegistry",
    "apply_template",
    "effective_max_seq_len",
    "eligible_text",
    "encode_cost",
    "prepare_encode_batch",
    "render_template",
    "resolve_templates",
    "tokenizer_id_of",
    "transform_text",
]

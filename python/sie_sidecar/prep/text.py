# SPDX-License-Identifier: Apache-2.0
"""Which encode items get sidecar tokens, and the text they are tokenized from (scheduler §6.1-6.2).

The sidecar and the backend must turn an item into the same string, or prepared tokens would embed
something other than what the backend computes on its own; so the reference backend imports these
functions too instead of keeping a copy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["apply_template", "eligible_text", "render_template", "resolve_templates", "transform_text"]

_BRACE: Final = re.compile(r"[{}]")


def render_template(template: str, text: str, instruction: str) -> str:
    """The Rust formatter of §6.2: `{text}`, `{instruction}`, `{{`/`}}` escapes; anything else literal.

    Unlike `str.format` it never raises: an unknown `{name}`, an unclosed `{` and a lone `}` pass
    through verbatim, because a template typo must not turn into a failed request.
    """
    out: list[str] = []
    i, n = 0, len(template)
    while i < n:
        brace = _next_brace(template, i)
        if brace > i:
            out.append(template[i:brace])
            i = brace
            if i >= n:
                break
        if template.startswith("{{", i) or template.startswith("}}", i):
            out.append(template[i])
            i += 2
        elif template[i] == "}":
            out.append("}")
            i += 1
        else:
            close = template.find("}", i + 1)
            if close < 0:
                out.append(template[i:])
                break
            name = template[i + 1 : close]
            out.append(text if name == "text" else instruction if name == "instruction" else template[i : close + 1])
            i = close + 1
    return "".join(out)


def _next_brace(template: str, start: int) -> int:
    """Index of the next `{` or `}` at or after `start`, else `len(template)`."""
    match = _BRACE.search(template, start)
    return len(template) if match is None else match.start()


def apply_template(
    text: str, instruction: str | None, is_query: bool, query_template: str | None, doc_template: str | None
) -> str:
    """§6.2 precedence: a non-empty template, else `instruction + " " + text`, else the text."""
    template = query_template if is_query else doc_template
    if template:
        return render_template(template, text, instruction or "")
    if instruction:
        return f"{instruction} {text}"
    return text


def resolve_templates(
    options: object, default_query: str | None, default_doc: str | None
) -> tuple[str | None, str | None]:
    """Per-request `options` templates win when they are strings (even empty); others are ignored."""
    query, doc = default_query, default_doc
    if isinstance(options, Mapping):
        if isinstance(options.get("query_template"), str):
            query = options["query_template"]
        if isinstance(options.get("doc_template"), str):
            doc = options["doc_template"]
    return query, doc


def transform_text(
    encode_item: Mapping[str, Any], text: str, default_query: str | None, default_doc: str | None
) -> str:
    """The string an EncodeBatchItem's `text` is tokenized as, given the model's default templates."""
    query_template, doc_template = resolve_templates(encode_item.get("options"), default_query, default_doc)
    instruction = encode_item.get("instruction")
    return apply_template(
        text,
        instruction if isinstance(instruction, str) else None,
        encode_item.get("is_query") is True,
        query_template,
        doc_template,
    )


def eligible_text(encode_item: Mapping[str, Any]) -> str | None:
    """§6.1: the item's `text` when it is a non-empty string; None sends the item to the backend as is."""
    payload = encode_item.get("item")
    if not isinstance(payload, Mapping):
        return None
    text = payload.get("text")
    return text if isinstance(text, str) and text else None

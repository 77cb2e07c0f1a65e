# SPDX-License-Identifier: Apache-2.0
"""Generation media before the backend sees it (wire-protocol §7.4, sidecar-behaviour §12): each
message's `images[*].data` base64 string becomes msgpack binary, within the limits of at most 16
images across all messages and 16 MiB of decoded bytes in total. Binary data is taken as it is (an
offloaded generate value may carry it). Anything else is `INVALID_INPUT` for the caller."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Final

from ..errors import GenerateMediaError

MAX_IMAGES: Final = 16
MAX_IMAGE_BYTES: Final = 16 * 1024 * 1024


def normalise_generate_images(generate: Any) -> None:
    """Decode every message's image data in place; `GenerateMediaError` on a bad image or limit."""
    if not isinstance(generate, dict):
        return
    messages = generate.get("messages")
    if not isinstance(messages, list):
        return
    count = 0
    total = 0
    for message in messages:
        images = message.get("images") if isinstance(message, dict) else None
        if images is None:
            continue
        if not isinstance(images, list):
            raise GenerateMediaError("images must be an array")
        for image in images:
            if not isinstance(image, dict):
                raise GenerateMediaError("each image must be a map")
            count += 1
            if count > MAX_IMAGES:
                raise GenerateMediaError(f"at most {MAX_IMAGES} images per request")
            data = image.get("data")
            if isinstance(data, str):
                try:
                    data = base64.b64decode(data, validate=True)
                except (binascii.Error, ValueError):
                    raise GenerateMediaError("image data is not valid base64") from None
                image["data"] = data
            elif not isinstance(data, bytes | bytearray):
                raise GenerateMediaError("image data must be a base64 string or binary")
            total += len(data)
            if total > MAX_IMAGE_BYTES:
                raise GenerateMediaError(f"images exceed {MAX_IMAGE_BYTES} decoded bytes")


__all__ = ["MAX_IMAGES", "MAX_IMAGE_BYTES", "GenerateMediaError", "normalise_generate_images"]

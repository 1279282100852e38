"""Images in requests: the content parts of the three APIs, their bytes, and the model's processor.

Message conversion (:mod:`atlas_core.server.prompts`, :mod:`~atlas_core.server.responses_input`)
turns an image part into the template item ``{"type": "image", "image": ImageRef}``, which
vision-language chat templates render as their placeholder. :func:`attach_images` then reads
every image (``data:`` URLs and base64 at once; ``http(s)`` URLs only from the domains the
server allows), hands the rendered prompt and the bytes to the model's multimodal processor
(``model.mm_processor``: ``process(prompt_ids, images) -> (prompt_ids, payload)``, raising
``ValueError``, with ``image_index`` set when one image is at fault) and returns the expanded
prompt and the payload the engine carries (``Sequence.mm``).
"""

from __future__ import annotations

import base64
import binascii
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from atlas_core.server.errors import APIError


@dataclass(frozen=True)
class ImageRef:
    """One image part of a request, as sent: checked only once the model is known to take
    images (a text model answers every image part with the same 400).

    Attributes:
        param: the part's location, e.g. ``messages[0].content[1]``.
        url: an OpenAI / Responses image URL (``data:`` or ``http(s)``).
        source: an Anthropic image ``source`` object.
    """

    param: str
    url: Any = None
    source: Any = None


def _decode_base64(data: Any, param: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise APIError(400, "the image is not valid base64", param=param,
                       code="invalid_image") from None


def openai_image_part(image_url: Any, param: str) -> dict:
    """The template item of an OpenAI ``{"type": "image_url", "image_url": {"url": ...}}``."""
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    return {"type": "image", "image": ImageRef(param, url=url)}


def responses_image_part(part: dict, param: str) -> dict:
    """The template item of a Responses ``{"type": "input_image", "image_url": ...}``."""
    return {"type": "image", "image": ImageRef(param, url=part.get("image_url"))}


def anthropic_image_block(source: Any, param: str) -> dict:
    """The template item of an Anthropic ``{"type": "image", "source": {...}}`` block."""
    return {"type": "image", "image": ImageRef(param, source=source)}


def _url_bytes(url: Any, param: str, config: Any) -> bytes:
    if not isinstance(url, str) or not url:
        raise APIError(400, "an image part needs its URL (a data: URL or an http(s) URL)",
                       param=param)
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if not header.endswith(";base64") or not payload:
            raise APIError(400, "data: URLs of images must be base64 "
                           "(data:image/png;base64,...)", param=param, code="invalid_image")
        return _decode_base64(payload, param)
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise APIError(400, "image URLs must be data: or http(s) URLs", param=param,
                       code="invalid_image")
    if not _allowed(url, config.allowed_media_domains):
        raise APIError(400, "fetching image URLs from this domain is off on this server; send "
                       "the image inline (a data: URL or base64), or start the server with "
                       "--allowed-media-domains naming the domain", param=param,
                       code="image_url_not_allowed")
    try:
        with urllib.request.urlopen(url, timeout=config.media_fetch_timeout) as resp:
            return resp.read(config.max_image_bytes + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise APIError(400, f"cannot fetch the image URL ({exc}); check it, or send the "
                       "image inline", param=param, code="image_fetch_failed") from None


def _source_bytes(source: Any, param: str, config: Any) -> bytes:
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        return _decode_base64(source.get("data"), f"{param}.source.data")
    if kind == "url":
        return _url_bytes(source.get("url"), f"{param}.source.url", config)
    raise APIError(400, 'an image block needs source {"type": "base64", "media_type", "data"} '
                   'or {"type": "url", "url"}', param=f"{param}.source")


def images_of(messages: list[dict]) -> list[ImageRef]:
    """Every image of the template messages, in order."""
    refs = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            refs += [item["image"] for item in content
                     if isinstance(item, dict) and isinstance(item.get("image"), ImageRef)]
    return refs


def _allowed(url: str, domains: list[str]) -> bool:
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    return any(d == "*" or host == d.lower() or host.endswith("." + d.lower()) for d in domains)


def fetch_image(ref: ImageRef, config: Any) -> bytes:
    """The encoded bytes of ``ref``: as sent, or fetched (allowed domains, timeout, size cap)."""
    if ref.source is not None:
        data = _source_bytes(ref.source, ref.param, config)
    else:
        data = _url_bytes(ref.url, f"{ref.param}.image_url", config)
    if len(data) > config.max_image_bytes:
        raise APIError(400, f"the image is larger than {config.max_image_bytes} bytes; send a "
                       "smaller one", param=ref.param, code="image_too_large")
    return data


def attach_images(state: Any, messages: list[dict], ids: list[int]) -> tuple[list[int], Any]:
    """``(prompt ids with image placeholders expanded, multimodal payload)``; ``(ids, None)``
    for a text-only conversation.

    Raises:
        APIError: 400 for a model without a vision tower, too many, undecodable or oversized
            images, or a template that did not render every image.
    """
    refs = images_of(messages)
    if not refs:
        return ids, None
    processor = state.mm_processor
    if processor is None:
        raise APIError(400, "image inputs are not supported by this model (it has no vision "
                       "tower Atlas can run); remove the image parts or describe them in text",
                       param=f"{refs[0].param}.type", code="unsupported_modality")
    limit = state.config.max_images_per_request
    if len(refs) > limit:
        raise APIError(400, f"{len(refs)} images in one request; at most {limit} are allowed",
                       param=refs[limit].param, code="too_many_images")
    images = [fetch_image(ref, state.config) for ref in refs]
    try:
        return processor.process(ids, images)
    except ValueError as exc:
        index = getattr(exc, "image_index", None)
        param = refs[index].param if isinstance(index, int) else "messages"
        raise APIError(400, f"cannot use the image: {exc}", param=param,
                       code="invalid_image") from None

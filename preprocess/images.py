"""Images: base64 or `data:` URLs -> decoded, size-checked RGB images, with limits from the deployment.

Checks, in the order that keeps a hostile input cheap:
  1. the number of images per request;
  2. the encoded size (base64 length bounds the decoded bytes before decoding them);
  3. strict base64 decoding;
  4. the header: Pillow's `Image.open` reads only the header, so the pixel count is checked BEFORE the full
     decode (a decompression bomb is refused without inflating it); the format must be an allowed one;
  5. the full decode (truncated or corrupt data fails here), with `Image.MAX_IMAGE_PIXELS` set to the limit as
     a second line of defence, and conversion to RGB.

The decoded images travel to the core as raw RGB bytes (see `EncodedImage`): the engine process then does no
image decoding at all (no decoder attack surface and no decode CPU in the process that feeds the engine), and
the pixel limit bounds the size of what travels.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.interface import InvalidInput
from core.protocol import RgbImage

DEFAULT_MAX_IMAGE_BYTES = 10 * 1024 * 1024  # encoded (decoded from base64) bytes per image
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096  # width * height per image
DEFAULT_MAX_IMAGES = 4  # per request
ALLOWED_FORMATS = frozenset({"PNG", "JPEG", "WEBP", "GIF", "BMP"})

# The limits' rules, shared with the deployment schema's `images` keys (repo_render/schema.py). A size limit of 0
# would refuse every image with a misleading message; an image count of 0 is meaningful: a vision model deployed to
# serve text only refuses every image, saying max_images=0.
ImageBytes = Annotated[int, Field(ge=1)]
ImagePixels = Annotated[int, Field(ge=1)]
ImageCount = Annotated[int, Field(ge=0)]

_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,", re.I)


class ImageLimits(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    max_image_bytes: ImageBytes = DEFAULT_MAX_IMAGE_BYTES
    max_image_pixels: ImagePixels = DEFAULT_MAX_IMAGE_PIXELS
    max_images: ImageCount = DEFAULT_MAX_IMAGES

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> ImageLimits:
        """The limits among a preprocess stage's settings; a missing or null one keeps its default."""
        values = {key: settings[key] for key in cls.model_fields if settings.get(key) is not None}
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            error = exc.errors()[0]
            raise ValueError(
                f"preprocess setting {error['loc'][0]}: {error['msg'].lower()}, got {error['input']!r}"
            ) from None


def _payload(source: str, where: str) -> str:
    """The base64 text of a `data:` URL or of raw base64; anything else (http URLs, files) is refused."""
    source = source.strip()
    if source.startswith("data:"):
        match = _DATA_URL.match(source)
        if match is None or not match.group("b64"):
            raise InvalidInput(f"{where}: expected a base64 data URL (data:image/png;base64,...)")
        mime = (match.group("mime") or "").lower()
        if mime and not mime.startswith("image/"):
            raise InvalidInput(f"{where}: data URL of type {mime!r} is not an image")
        return source[match.end() :]
    if "://" in source[:16]:
        raise InvalidInput(f"{where}: only base64 data or data: URLs are accepted, not {source[:16]!r}...")
    return source


def decode_image(source: str | bytes, limits: ImageLimits, where: str) -> RgbImage:
    """One checked image, decoded to the raw RGB pixels the engine request carries."""
    from PIL import Image, UnidentifiedImageError

    text = source.decode("ascii", "replace") if isinstance(source, bytes) else source
    payload = "".join(_payload(text, where).split())  # base64 may be wrapped over lines
    # 4 base64 characters carry 3 bytes: refuse an oversized image before decoding anything.
    if len(payload) // 4 * 3 > limits.max_image_bytes + 3:
        raise InvalidInput(f"{where}: image is more than max_image_bytes={limits.max_image_bytes}")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"{where}: invalid base64 ({exc})") from None
    if len(data) > limits.max_image_bytes:
        raise InvalidInput(f"{where}: image is {len(data)} bytes, more than max_image_bytes={limits.max_image_bytes}")
    if not data:
        raise InvalidInput(f"{where}: empty image")
    try:
        image = Image.open(io.BytesIO(data), formats=sorted(ALLOWED_FORMATS))  # reads the header only
        width, height = image.size
        if width * height > limits.max_image_pixels:
            raise InvalidInput(
                f"{where}: image is {width}x{height} = {width * height} pixels,"
                f" more than max_image_pixels={limits.max_image_pixels}"
            )
        if width == 0 or height == 0:
            raise InvalidInput(f"{where}: image has no pixels ({width}x{height})")
        image.load()  # the full decode: truncated or corrupt data fails here
        rgb = image.convert("RGB")
    except InvalidInput:
        raise
    except UnidentifiedImageError:
        raise InvalidInput(
            f"{where}: not an image in a supported format ({', '.join(sorted(ALLOWED_FORMATS))})"
        ) from None
    except Image.DecompressionBombError as exc:
        # Pillow's own header check (Image.MAX_IMAGE_PIXELS, set from the limit) fired first.
        raise InvalidInput(
            f"{where}: more than max_image_pixels={limits.max_image_pixels}, refused before decoding ({exc})"
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:  # Pillow's errors for truncated/corrupt data
        raise InvalidInput(f"{where}: cannot decode the image ({exc})") from None
    return RgbImage(rgb.width, rgb.height, rgb.tobytes())


def decode_images(sources: Sequence[str | bytes], limits: ImageLimits, where: str) -> list[RgbImage]:
    if len(sources) > limits.max_images:
        raise InvalidInput(f"{where}: {len(sources)} images, more than max_images={limits.max_images} per request")
    _set_pillow_bomb_limit(limits.max_image_pixels)
    return [decode_image(source, limits, f"{where}[{i}]") for i, source in enumerate(sources)]


def _set_pillow_bomb_limit(max_pixels: int) -> None:
    """Pillow's own guard (process-wide): warn above the limit, refuse above twice it."""
    from PIL import Image

    if Image.MAX_IMAGE_PIXELS is None or max_pixels < Image.MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = max(max_pixels, 1)

"""Images in a training or serving sequence: how many tokens an image becomes, and what the vision tower keeps.

Qwen2.5-VL's processor (transformers 5.24 ``Qwen2VLImageProcessor``, models/qwen2_vl/image_processing_qwen2_vl.py)
resizes each image with ``smart_resize`` (lines 63-89): both sides rounded to a multiple of
``patch_size * merge_size`` (28 pixels), the area kept within ``min_pixels`` (56·56) and ``max_pixels`` (28·28·1280)
by scaling both sides, the aspect ratio at most 200. The resized ``H x W`` image is cut into
``(H / 14) · (W / 14)`` patches (each of 2 frames: the still image repeated to ``temporal_patch_size``), which the
tower turns into ``(H / 14) · (W / 14) / merge_size²`` tokens. ``Qwen2_5_VLProcessor`` (processing_qwen2_5_vl.py)
writes that many ``<|image_pad|>`` tokens into the text in place of each image, so the image tokens are part of
the tokenised sequence: cabe counts them inside ``seq`` (training) and ``context`` (serving), as a collator that
truncates or packs to ``max_length`` does, and refuses images whose tokens do not fit.

No torch here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.vision.tower import VisionTower

#: the largest side cabe accepts, in pixels (a typo guard; smart_resize scales large images down anyway)
MAX_SIDE = 1 << 16

_SIZE = re.compile(r"^\s*(\d+)\s*(?:[x×X*]\s*(\d+))?\s*$")


def parse_image_size(text: object) -> tuple[int, int]:
    """``"HxW"`` (or ``"N"`` for a square) -> (height, width) in pixels; a typed error otherwise."""
    m = _SIZE.match(text) if isinstance(text, str) else None
    if m is None:
        raise InvalidValueError("bad_image_size", "image_size", value=text)
    h = int(m.group(1))
    w = int(m.group(2) or m.group(1))
    if not (1 <= h <= MAX_SIDE and 1 <= w <= MAX_SIDE):
        raise InvalidValueError("bad_image_size", "image_size", value=text)
    return h, w


def resized(tower: VisionTower, height: int, width: int) -> tuple[int, int]:
    """The image's size after the processor's ``smart_resize`` (image_processing_qwen2_vl.py:63-89, transformers
    5.24), with ``factor = patch_size * merge_size`` and the tower's pixel bounds."""
    factor = tower.patch_size * tower.merge_size
    if max(height, width) / min(height, width) > 200:
        raise InvalidValueError("image_aspect_ratio", "image_size", value=f"{height}x{width}", maximum=200)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > tower.max_pixels:
        beta = math.sqrt((height * width) / tower.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < tower.min_pixels:
        beta = math.sqrt(tower.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ImageGrid:
    """One image as the tower sees it: ``height x width`` pixels after the resize, ``grid_h x grid_w`` patches."""

    height: int
    width: int
    grid_h: int
    grid_w: int
    merge_size: int

    @property
    def patches(self) -> int:
        """Patch tokens the tower's blocks run on (``grid_t`` is 1 for an image)."""
        return self.grid_h * self.grid_w

    @property
    def tokens(self) -> int:
        """Text tokens the image becomes: one per ``merge_size²`` patches."""
        return self.patches // self.merge_size**2


def image_grid(tower: VisionTower, size: str) -> ImageGrid:
    """The grid of one image of ``size`` (``"HxW"`` pixels) after the processor's resize.

    A SigLIP tower (Gemma 3) sees every image as an ``image_size`` square: ``Gemma3ImageProcessor`` resizes to its
    ``size`` (the tower's image_size, 896 for the released checkpoints; image_processing_gemma3.py, transformers
    5.24), without pan-and-scan by default (``do_pan_and_scan`` False in ``Gemma3Processor``'s defaults); the
    projector's average pool (kernel ``merge_size``) makes ``tokens_per_image`` soft tokens of its
    ``(image_size / patch_size)²`` patches: 256 of 4,096 for 896 px and 14 px patches."""
    if tower.kind == "siglip":
        parse_image_size(size)  # any size is resized to the square; a malformed one is still an error
        side = tower.image_size // tower.patch_size
        return ImageGrid(tower.image_size, tower.image_size, side, side, tower.merge_size)
    h, w = resized(tower, *parse_image_size(size))
    return ImageGrid(h, w, h // tower.patch_size, w // tower.patch_size, tower.merge_size)


def check_images(spec: ModelSpec, images: int, size: str, tokens: int, field: str = "images") -> ImageGrid | None:
    """The grid of the request's images, or None without images; a typed error when the model has no tower
    cabe models, or when ``images`` images' tokens do not fit in ``tokens`` (the sequence or context)."""
    if images == 0:
        return None
    if spec.vision is None:
        raise InvalidValueError("images_need_vision", field, value=images, model=spec.name or spec.model_type)
    grid = image_grid(spec.vision, size)
    if images * grid.tokens > tokens:
        raise InvalidValueError(
            "images_exceed_seq", field, value=images, tokens=grid.tokens, total=images * grid.tokens, seq=tokens
        )
    return grid

"""The fan-out job: one call per image (module-level, so a dispatcher can look it up).

No image library: the job checksums the stored bytes and computes the thumbnail's size
from the stored dimensions, which is what a real job would store next to the thumbnail.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.utils import timezone

from .models import Image

#: Thumbnails fit in this box, keeping the image's proportions.
BOX = (320, 320)


class BrokenImage(ValueError):
    """The upload cannot be read."""


def fit(width: int, height: int, box: tuple[int, int] = BOX) -> tuple[int, int]:
    """The size of ``width`` x ``height`` scaled down (never up) to fit in ``box``."""
    if width <= 0 or height <= 0:
        raise BrokenImage(f"an image of {width}x{height} has no pixels")
    scale = min(box[0] / width, box[1] / height, 1.0)
    return max(1, round(width * scale)), max(1, round(height * scale))


def make_thumbnail(image_id: int) -> dict[str, Any]:
    """Checksum the image and record its thumbnail size; safe to run twice (same result)."""
    image = Image.objects.get(pk=image_id)
    data = bytes(image.data)
    if not data:
        raise BrokenImage(f"{image.filename} is empty")
    thumb_width, thumb_height = fit(image.width, image.height)
    checksum = hashlib.sha256(data).hexdigest()
    Image.objects.filter(pk=image_id).update(
        checksum=checksum, thumb_width=thumb_width, thumb_height=thumb_height, processed_at=timezone.now()
    )
    return {"image": image_id, "checksum": checksum, "thumbnail": [thumb_width, thumb_height]}

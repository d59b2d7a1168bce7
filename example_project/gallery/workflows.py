"""An album: one thumbnail job per image in parallel, then publish what worked.

Shows ``@fan_out`` returning ``Job``s (with ``max_attempts``, ``backoff`` and
``on_job_failure="continue"``: a broken upload must not hold the album back), the fan-out's
counts as the step's output, and ``fan_out_results()`` in the next step.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from pgbus_workflows import Job, Workflow, fan_out, step

from .models import Album
from .thumbnails import make_thumbnail


class AlbumProcessing(Workflow):
    """Thumbnails for every image of an uploaded album, then the album goes live."""

    name = "gallery_album"

    @fan_out(max_attempts=2, backoff=timedelta(milliseconds=200), on_job_failure="continue")
    def make_thumbnails(self) -> list[Job]:
        return [Job(make_thumbnail, image_id=pk) for pk in self.subject.images.values_list("pk", flat=True)]

    @step
    def publish(self) -> dict[str, Any]:
        counts = self.outputs["make_thumbnails"]  # {"total", "succeeded", "failed"}
        done = [r["image"] for r in self.fan_out_results("make_thumbnails") if r is not None]
        Album.objects.filter(pk=self.subject.pk).update(published=True, published_at=timezone.now())
        return {"published_images": done, "skipped": counts["failed"]}

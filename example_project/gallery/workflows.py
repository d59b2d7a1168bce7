"""An album: one thumbnail job per image in parallel, then publish what worked; an import of albums.

``AlbumProcessing`` shows ``@fan_out`` returning ``Job``s (with ``max_attempts``, ``backoff``
and ``on_job_failure="continue"``: a broken upload must not hold the album back), the
fan-out's counts as the step's output, and ``fan_out_results()`` in the next step.
``GalleryImport`` shows child workflows: a ``@fan_out`` returning ``Child`` items (one
``AlbumProcessing`` run per album), ``self.output()`` kept beside them, the children's
results in the next step and ``self.finished(result)`` giving the run its result.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from pgbus_workflows import Child, Job, Workflow, fan_out, step

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


class GalleryImport(Workflow):
    """A user's import of several albums: one ``AlbumProcessing`` child per album, then a summary."""

    name = "gallery_import"

    @fan_out
    def process_albums(self) -> list[Child]:
        albums = Album.objects.filter(pk__in=self.arguments["albums"]).order_by("pk")
        self.output({"albums": [album.title for album in albums]})
        return [Child(AlbumProcessing, album) for album in albums]

    @step
    def summarise(self) -> None:
        published = [r["published_images"] for r in self.fan_out_results("process_albums")]
        self.finished({"albums": len(published), "images": sum(len(images) for images in published)})

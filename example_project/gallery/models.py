"""Albums of uploaded images, and what the thumbnail jobs computed for each image."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Album(models.Model):
    """A batch of uploaded images, published once every image has been processed."""

    title = models.CharField(max_length=200)
    published = models.BooleanField(default=False)
    published_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return self.title


class Image(models.Model):
    """One uploaded image: its bytes and the dimensions read from its header at upload."""

    album = models.ForeignKey(Album, on_delete=models.CASCADE, related_name="images")
    filename = models.CharField(max_length=200)
    data = models.BinaryField()
    width = models.PositiveIntegerField(help_text="0 when the header could not be read")
    height = models.PositiveIntegerField(help_text="0 when the header could not be read")
    # Written by the thumbnail job:
    checksum = models.CharField("SHA-256", max_length=64, blank=True)
    thumb_width = models.PositiveIntegerField(null=True, blank=True)
    thumb_height = models.PositiveIntegerField(null=True, blank=True)
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("album", "id")

    def __str__(self) -> str:
        return self.filename

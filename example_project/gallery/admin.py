from django.contrib import admin

from ..admin_links import workflow_runs_link
from .models import Album, Image


class ImageInline(admin.TabularInline):
    model = Image
    extra = 0
    fields = ("filename", "width", "height", "thumb_width", "thumb_height", "checksum", "processed_at")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(Album)
class AlbumAdmin(admin.ModelAdmin):
    list_display = ("title", "published", "published_at", "created_at", "runs")
    list_filter = ("published",)
    search_fields = ("title",)
    readonly_fields = ("published", "published_at", "runs")
    inlines = (ImageInline,)

    @admin.display(description="workflow")
    def runs(self, obj: Album) -> str:
        return workflow_runs_link(obj)


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ("filename", "album", "width", "height", "thumb_width", "thumb_height", "processed_at")
    list_filter = ("album",)
    search_fields = ("filename",)
    exclude = ("data",)
    readonly_fields = ("checksum", "thumb_width", "thumb_height", "processed_at")

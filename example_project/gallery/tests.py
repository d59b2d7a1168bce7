"""The album workflow: one thumbnail job per image, then publish."""

from django.contrib.auth.models import User
from django.test import SimpleTestCase, TestCase
from django.urls import reverse

from pgbus_workflows.testing import WorkflowTestMixin

from .models import Album, Image
from .thumbnails import BrokenImage, fit
from .workflows import AlbumProcessing, GalleryImport


def album_with(*sizes: tuple[int, int]) -> Album:
    album = Album.objects.create(title="Team offsite")
    for n, (width, height) in enumerate(sizes):
        Image.objects.create(album=album, filename=f"IMG_{n}.jpg", data=bytes([n]) * 100, width=width, height=height)
    return album


class AlbumProcessingTests(WorkflowTestMixin, TestCase):
    def test_every_image_gets_a_thumbnail_then_the_album_is_published(self) -> None:
        album = album_with((4032, 3024), (1080, 1920), (200, 100))
        wf = AlbumProcessing.start(album)
        self.run_step_inline(wf, "make_thumbnails")  # opens one job per image
        self.assertWorkflowStatus(wf, "waiting")
        self.complete_fan_out(wf)  # runs the jobs
        self.speedrun_workflow(wf)
        self.assertWorkflowStatus(wf, "finished")
        sizes = list(album.images.values_list("thumb_width", "thumb_height"))
        self.assertEqual(sizes, [(320, 240), (180, 320), (200, 100)])
        self.assertTrue(all(len(c) == 64 for c in album.images.values_list("checksum", flat=True)))
        album.refresh_from_db()
        self.assertTrue(album.published)
        self.assertEqual(wf.outputs["make_thumbnails"], {"total": 3, "succeeded": 3, "failed": 0})

    def test_a_broken_image_is_skipped_and_the_album_still_goes_live(self) -> None:
        album = album_with((800, 800), (0, 0))
        wf = AlbumProcessing.start(album)
        self.perform_next_step(wf)
        self.complete_fan_out(wf)  # the broken image fails both of its attempts
        self.speedrun_workflow(wf)
        self.assertWorkflowStatus(wf, "finished")
        self.assertEqual(wf.outputs["make_thumbnails"], {"total": 2, "succeeded": 1, "failed": 1})
        self.assertEqual(wf.outputs["publish"]["skipped"], 1)

    def test_an_empty_album_is_published_at_once(self) -> None:
        wf = self.speedrun_workflow(AlbumProcessing.start(album_with()))
        self.assertWorkflowStatus(wf, "finished")


class GalleryImportTests(WorkflowTestMixin, TestCase):
    def test_each_album_is_a_child_run_and_the_import_answers_with_the_totals(self) -> None:
        albums = [album_with((800, 800), (640, 480)), album_with((0, 0), (300, 300), (1024, 768))]
        wf = GalleryImport.start(albums=[a.pk for a in albums])
        self.perform_next_step(wf)  # starts one AlbumProcessing child per album
        self.assertEqual([c.subject for c in wf.children], albums)
        self.complete_fan_out(wf)  # runs the children (and their thumbnail jobs) to their end
        self.speedrun_workflow(wf)
        self.assertEqual(wf.result(), {"albums": 2, "images": 4})  # the broken image was skipped
        self.assertEqual(wf.outputs["process_albums"], {"albums": ["Team offsite", "Team offsite"]})
        self.assertTrue(all(Album.objects.values_list("published", flat=True)))


class FitTests(SimpleTestCase):
    def test_scales_down_to_the_box_keeping_the_proportions(self) -> None:
        self.assertEqual(fit(6000, 4000), (320, 213))
        self.assertEqual(fit(1000, 3000), (107, 320))

    def test_never_scales_up(self) -> None:
        self.assertEqual(fit(64, 48), (64, 48))

    def test_an_image_without_pixels_is_broken(self) -> None:
        with self.assertRaises(BrokenImage):
            fit(0, 100)


class AlbumAdminTests(TestCase):
    def test_the_album_pages_render(self) -> None:
        album = album_with((800, 600))
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
        self.assertContains(self.client.get(reverse("admin:gallery_album_changelist")), "Team offsite")
        self.assertContains(self.client.get(reverse("admin:gallery_album_change", args=[album.pk])), "IMG_0.jpg")
        image = album.images.get()
        self.assertEqual(self.client.get(reverse("admin:gallery_image_change", args=[image.pk])).status_code, 200)

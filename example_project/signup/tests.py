"""The signup drip, tested the way a project tests its own workflows."""

from django.contrib.auth.models import User
from django.test import TestCase
from django.urls import reverse

from pgbus_workflows.testing import WorkflowTestMixin

from .models import DripEmail, Signup
from .workflows import SignupDrip


def sign_up(**fields: object) -> Signup:
    defaults: dict[str, object] = {"email": "ada@example.com", "name": "Ada"}
    return Signup.objects.create(**{**defaults, **fields})


def sent(signup: Signup) -> list[str]:
    return list(signup.emails.values_list("kind", flat=True))


class SignupDripTests(WorkflowTestMixin, TestCase):
    def test_a_trial_with_tips_gets_the_three_emails(self) -> None:
        ada = sign_up()
        wf = SignupDrip.start(ada)
        self.speedrun_workflow(wf)
        self.assertWorkflowStatus(wf, "finished")
        self.assertStepsCompleted(wf, ["welcome", "tips", "upgrade_offer"])
        self.assertEqual(sent(ada), ["welcome", "tips", "upgrade_offer"])

    def test_the_steps_wait_between_emails(self) -> None:
        wf = SignupDrip.start(sign_up())
        self.perform_next_step(wf)
        tips = wf.steps.get(step_name="tips")
        self.assertGreater(tips.scheduled_at, tips.created_at)

    def test_no_tips_without_the_opt_in(self) -> None:
        grace = sign_up(email="grace@example.com", marketing_opt_in=False)
        wf = self.speedrun_workflow(SignupDrip.start(grace))
        self.assertWorkflowStatus(wf, "finished")
        self.assertStepsCompleted(wf, ["welcome", "upgrade_offer"])
        self.assertEqual(wf.steps.get(step_name="tips").status, "skipped")

    def test_a_paying_customer_gets_no_upgrade_offer(self) -> None:
        linus = sign_up(email="linus@example.com", plan=Signup.Plan.PAID)
        wf = self.speedrun_workflow(SignupDrip.start(linus))
        self.assertStepsCompleted(wf, ["welcome", "tips"])
        self.assertEqual(sent(linus), ["welcome", "tips"])

    def test_unsubscribing_cancels_the_drip_before_the_next_email(self) -> None:
        margaret = sign_up(email="margaret@example.com")
        wf = SignupDrip.start(margaret)
        self.run_step_inline(wf, "welcome")
        Signup.objects.filter(pk=margaret.pk).update(unsubscribed=True)
        self.run_step_inline(wf, "tips")
        self.assertWorkflowStatus(wf, "cancelled")
        self.assertEqual(sent(margaret), ["welcome"])

    def test_a_second_start_for_the_same_signup_is_the_first_run(self) -> None:
        ada = sign_up()
        first = SignupDrip.start(ada, idempotency_key=f"signup-{ada.pk}")
        again = SignupDrip.start(ada, idempotency_key=f"signup-{ada.pk}")
        self.assertTrue(again.duplicate_start)
        self.assertEqual(again.workflow_id, first.workflow_id)

    def test_each_email_is_written_once_with_its_step(self) -> None:
        ada = sign_up()
        wf = self.speedrun_workflow(SignupDrip.start(ada))
        self.assertEqual(DripEmail.objects.filter(signup=ada).count(), 3)
        self.assertEqual(wf.outputs["welcome"], {"sent": "welcome", "to": "ada@example.com"})


class SignupAdminTests(WorkflowTestMixin, TestCase):
    def test_a_signup_page_shows_its_emails_and_links_to_its_runs(self) -> None:
        ada = sign_up()
        self.speedrun_workflow(SignupDrip.start(ada))
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
        self.assertContains(self.client.get(reverse("admin:signup_signup_changelist")), "ada@example.com")
        page = self.client.get(reverse("admin:signup_signup_change", args=[ada.pk]))
        self.assertContains(page, "Three things to try this week")
        self.assertContains(page, f"subject_type=signup.signup&amp;subject_id={ada.pk}")

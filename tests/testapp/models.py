"""Models the test workflows are about, and tables their steps write to."""

from django.db import models


class Order(models.Model):
    status = models.CharField(max_length=16, default="new")
    reviewed = models.BooleanField(default=False)


class Receipt(models.Model):
    """Written by atomic steps: exactly one per successful attempt."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, null=True)
    note = models.CharField(max_length=64, default="")


class SideEffect(models.Model):
    """What a step body did (its name, attempt and idempotency key), in order."""

    label = models.CharField(max_length=128)
    key = models.CharField(max_length=255, default="")
    created_at = models.DateTimeField(auto_now_add=True)


class ChaosRecord(models.Model):
    """What a chaos-harness step or job did: ``kind`` (atomic, key, execution, job), which run, which process."""

    kind = models.CharField(max_length=16)
    run_key = models.CharField(max_length=64)
    key = models.CharField(max_length=255)
    pid = models.IntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["kind", "run_key"])]

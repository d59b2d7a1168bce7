"""Workflow classes of the child-workflow tests (imported by ``workflows``, so dispatchers know them)."""

import time

from pgbus_workflows import Child, Workflow, fan_out, step

from .models import Order, SideEffect


def record(label: str, key: str = "") -> None:
    SideEffect.objects.create(label=label, key=key)


class Shipment(Workflow):
    """A child: ships one parcel (an Order as its subject) with a carrier; its result is the tracking."""

    name = "shipment"
    allow_multiple = True

    @step
    def label(self):
        record("label", str(self.subject.pk))
        return {"carrier": self.arguments["carrier"]}

    @step
    def ship(self):
        if self.arguments.get("cancel"):
            self.cancel("no such address")
        return {"tracking": f"{self.arguments['carrier']}-{self.subject.pk}"}


class ShipOrder(Workflow):
    """A parent: one Shipment child per order in ``orders``, then a step that reads their results."""

    name = "ship_order"
    allow_multiple = True

    @fan_out(on_job_failure="fail")
    def shipments(self):
        self.output({"parcels": len(self.arguments["orders"])})
        return [
            Child(Shipment, Order.objects.get(pk=pk), carrier="dhl", cancel=pk in self.arguments.get("cancel", []))
            for pk in self.arguments["orders"]
        ]

    @step
    def confirm(self):
        tracking = [r["tracking"] if r else None for r in self.fan_out_results("shipments")]
        record("confirm", ",".join(str(t) for t in tracking))
        self.finished({"tracking": tracking})


class ShipWhatever(ShipOrder):
    """As ShipOrder, but a cancelled child does not fail the step (``on_job_failure="continue"``)."""

    name = "ship_whatever"

    @fan_out(on_job_failure="continue")
    def shipments(self):
        return [
            Child(Shipment, Order.objects.get(pk=pk), carrier="ups", cancel=pk in self.arguments.get("cancel", []))
            for pk in self.arguments["orders"]
        ]


class Waiter(Workflow):
    """A child that waits for a signal ``go``, then answers with its payload."""

    name = "child_waiter"
    allow_multiple = True

    @step(wait_for="go")
    def hold(self):
        return self.received_signal.payload


class Abandoned(Workflow):
    """A parent of Waiter children: ``abandon`` of them are left running when the parent is cancelled."""

    name = "abandons"
    allow_multiple = True

    @fan_out
    def spawn(self):
        abandon = self.arguments.get("abandon", 0)
        return [
            Child(Waiter, parent_close="abandon" if i < abandon else "cancel", n=i)
            for i in range(self.arguments.get("count", 2))
        ]


class Tree(Workflow):
    """A workflow whose fan-out starts ``width`` Trees one level deeper until ``depth`` (a grandparent chain)."""

    name = "tree"
    allow_multiple = True

    @fan_out
    def grow(self):
        depth = self.arguments["depth"]
        if depth == 0:
            return [Child(Waiter, n=0)]
        return [Child(Tree, depth=depth - 1, width=self.arguments["width"]) for _ in range(self.arguments["width"])]


class Forever(Workflow):
    """A workflow that starts itself as its child, without end: MAX_CHILD_DEPTH stops it."""

    name = "forever"
    allow_multiple = True

    @fan_out
    def again(self):
        return [Child(Forever)]


class SlowChild(Workflow):
    """A child that sleeps ``seconds`` then answers ``n``: gives a window while the parent waits."""

    name = "slow_child"
    allow_multiple = True

    @step
    def nap(self):
        time.sleep(self.arguments.get("seconds", 0))
        return {"n": self.arguments["n"]}


class Many(Workflow):
    """A parent of ``count`` SlowChild children (after ``pause`` seconds), then a step that sums their answers."""

    name = "many_children"
    allow_multiple = True

    @fan_out
    def spawn(self):
        record("spawn", str(self.attempt))
        time.sleep(self.arguments.get("pause", 0))  # a window for the process tests to take a lock
        return [Child(SlowChild, n=i, seconds=self.arguments.get("seconds", 0)) for i in range(self.arguments["count"])]

    @step
    def total(self):
        return sum(r["n"] for r in self.fan_out_results("spawn"))

"""Live lease events over a websocket: one lease, or every lease the person may see (their
tenants' leases; an operator's, all)."""

from pools.consumers import EventsConsumer

from .events import STREAM
from .models import Lease


class LeaseEventsConsumer(EventsConsumer):
    stream = STREAM
    model = Lease

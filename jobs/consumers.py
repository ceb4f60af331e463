"""Live job events over a websocket: one job, or every job the person may see."""

from pools.consumers import EventsConsumer

from .events import STREAM
from .models import Job


class JobEventsConsumer(EventsConsumer):
    stream = STREAM
    model = Job

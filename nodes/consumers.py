"""Live node events over a websocket, for operators (anyone else is refused at connect)."""

from pools.consumers import EventsConsumer

from .events import STREAM
from .models import Node


class NodeEventsConsumer(EventsConsumer):
    stream = STREAM
    model = Node

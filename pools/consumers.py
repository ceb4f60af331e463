"""The websocket side of live events (pools/events.py): one consumer class per stream, each a
subclass naming its `stream` and `model`, routed at /ws/<stream>/ (the whole stream as the API
lists it to this person) and /ws/<stream>/<pk>/ (one object the API shows them)."""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.urls import path

from .actors import Actor
from .events import subscriptions

NOT_SIGNED_IN = 4401
NOTHING_TO_FOLLOW = 4403  # not found and not yours look the same


class EventsConsumer(AsyncJsonWebsocketConsumer):
    stream: str = ""
    model = None

    @classmethod
    def routes(cls) -> list:
        return [
            path(f"ws/{cls.stream}/", cls.as_asgi()),
            path(f"ws/{cls.stream}/<int:pk>/", cls.as_asgi()),
        ]

    async def connect(self):
        actor = Actor.for_user(self.scope.get("user"))
        if not actor.is_person:
            await self._refuse(NOT_SIGNED_IN)
            return
        pk = self.scope["url_route"]["kwargs"].get("pk")
        self.groups_joined = await database_sync_to_async(subscriptions)(
            self.stream, self.model, actor, pk
        )
        if not self.groups_joined:
            await self._refuse(NOTHING_TO_FOLLOW)
            return
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def _refuse(self, code: int) -> None:
        """Accepted, then closed with `code` at once (nothing is sent): a close before the
        accept reaches the browser as a bare 1006, like a server that is down, and the page
        could not tell a final refusal from a moment's trouble."""
        await self.accept()
        await self.close(code=code)

    async def disconnect(self, code):
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def entity_event(self, message):
        await self.send_json(message["event"])

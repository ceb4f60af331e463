"""Live job events over a websocket: one job, or every job of the tenants a person belongs to."""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from pools.roles import tenant_roles

from .events import job_group, tenant_group
from .models import Job


class JobEventsConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        job_id = self.scope["url_route"]["kwargs"].get("job_id")
        self.groups_joined = await self._groups_for(user, job_id)
        if not self.groups_joined:
            await self.close(code=4403)  # not found and not yours look the same
            return
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    @database_sync_to_async
    def _groups_for(self, user, job_id):
        if job_id is None:
            return [tenant_group(tenant_id) for tenant_id in tenant_roles(user)]
        if Job.objects.visible_to(user).filter(pk=job_id).exists():
            return [job_group(job_id)]
        return []

    async def disconnect(self, code):
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def job_event(self, message):
        await self.send_json(message["event"])

from django.urls import path

from jobs.consumers import JobEventsConsumer

websocket_urlpatterns = [
    path("ws/jobs/", JobEventsConsumer.as_asgi()),
    path("ws/jobs/<int:job_id>/", JobEventsConsumer.as_asgi()),
]

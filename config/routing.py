from jobs.consumers import JobEventsConsumer
from leases.consumers import LeaseEventsConsumer
from nodes.consumers import NodeEventsConsumer

# /ws/<stream>/ and /ws/<stream>/<pk>/ for each: pools/consumers.py
websocket_urlpatterns = [
    *JobEventsConsumer.routes(),
    *LeaseEventsConsumer.routes(),
    *NodeEventsConsumer.routes(),
]

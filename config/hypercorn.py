"""The ASGI server's settings, for `hypercorn --config python:config.hypercorn
config.asgi:application` (what `make run` starts, and how docs/security.md says to serve it).

hypercorn, not daphne, because of slow clients: hypercorn's keep-alive timer runs from the
moment a connection opens (or its previous response ends) until a request's headers are
complete, and more bytes do not reset it, so it is a real header deadline. Twisted, under
daphne, only has an idle timeout that every byte resets: a client sending one header byte
every few seconds keeps its connection for hours. Bodies: config/timeouts.py.
"""

import os
from logging import getLogger

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.conf import settings as django_settings

# headers complete within this of the connection opening or the previous response; an idle
# keep-alive connection closes after it too
keep_alive_timeout = django_settings.HTTP_HEADER_TIMEOUT_S
# pings keep an idle websocket open through proxies (nginx's proxy_read_timeout), as daphne did
websocket_ping_interval = 20.0
# never a read timeout: it would also cut a download or an idle websocket, which send nothing
read_timeout = None
# its lines through the loggers, so settings.LOGGING's formatter renders them like every other
# line (JSON lines or the console's; config/logging.py)
accesslog = getLogger("hypercorn.access")
errorlog = getLogger("hypercorn.error")

del django_settings, getLogger  # hypercorn takes every name of this module for a setting

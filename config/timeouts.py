"""A request body that stalls is cut off: each chunk must arrive within `seconds` of the one
before (nginx's client_body_timeout, per read, so a large upload on a slow link still goes
through). The client gets a JSON 408 and its connection is closed; the application sees it
disconnect. The header deadline is the ASGI server's (config/hypercorn.py)."""

import asyncio
import json

TIMED_OUT = json.dumps(
    {"code": "request_timeout", "detail": "The request body stopped arriving."}
).encode()


class BodyTimeout:
    def __init__(self, app, seconds: float):
        self.app, self.seconds = app, seconds

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body_complete = timed_out = False

        async def receive_in_time():
            nonlocal body_complete, timed_out
            if timed_out:
                return {"type": "http.disconnect"}
            if body_complete:  # e.g. Django waiting for a disconnect while the view runs
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.seconds)
            except TimeoutError:
                timed_out = True
                await send(
                    {
                        "type": "http.response.start",
                        "status": 408,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(TIMED_OUT)).encode()),
                            (b"connection", b"close"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": TIMED_OUT})
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body"):
                body_complete = True
            return message

        async def send_unless_timed_out(message):
            if not timed_out:
                await send(message)

        await self.app(scope, receive_in_time, send_unless_timed_out)

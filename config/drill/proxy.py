"""A small TCP proxy, run as its own process: `python config/drill/proxy.py --listen HOST:PORT
[--listen …] --backend HOST:PORT [--backend …]`.

With several backends it is the drill's balancer: each new connection goes to the next backend
in turn (round robin), skipping one that refuses, so a killed web process costs no request
that had not reached it yet. With one it is the control plane's way to Redis, which the drill
cuts: SIGUSR1 closes every connection it carries and closes each new one at once (a partition
as the clients see it: their connections drop and reconnects fail), SIGUSR2 lets them through
again. Only the standard library: it starts in a fraction of a second, without Django.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

CONNECT_TIMEOUT_S = 2.0


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class Proxy:
    def __init__(self, backends: list[tuple[str, int]]):
        self.backends = backends
        self.next = 0
        self.cut = False
        self.carried: set[asyncio.StreamWriter] = set()

    def set_cut(self, cut: bool) -> None:
        self.cut = cut
        if cut:
            for writer in list(self.carried):
                writer.transport.abort()  # a reset, not a polite close: as a dropped link
            self.carried.clear()
        print(f"proxy: {'cut' if cut else 'restored'}", flush=True)

    async def connect(self):
        """The next backend that accepts, in turn; None when none does."""
        for _ in range(len(self.backends)):
            host, port = self.backends[self.next % len(self.backends)]
            self.next += 1
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(host, port), CONNECT_TIMEOUT_S
                )
            except (OSError, TimeoutError):
                continue
        return None

    async def handle(self, reader, writer) -> None:
        if self.cut:
            writer.transport.abort()
            return
        backend = await self.connect()
        if backend is None:
            writer.transport.abort()
            return
        backend_reader, backend_writer = backend
        pair = {writer, backend_writer}
        self.carried |= pair
        try:
            await asyncio.gather(
                pipe(reader, backend_writer), pipe(backend_reader, writer), return_exceptions=True
            )
        finally:
            self.carried -= pair
            for each in pair:
                each.transport.abort()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, ConnectionError):
        pass
    finally:
        # half-close: the other direction may still carry the answer
        if not writer.is_closing() and writer.can_write_eof():
            with contextlib.suppress(OSError):
                writer.write_eof()


async def serve(listen: list[tuple[str, int]], backends: list[tuple[str, int]]) -> None:
    proxy = Proxy(backends)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, proxy.set_cut, True)
    loop.add_signal_handler(signal.SIGUSR2, proxy.set_cut, False)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    servers = [await asyncio.start_server(proxy.handle, host, port) for host, port in listen]
    print(f"proxy: listening on {listen}, backends {backends}", flush=True)
    await stop.wait()
    for server in servers:
        server.close()
    proxy.set_cut(True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=address, action="append", required=True)
    parser.add_argument("--backend", type=address, action="append", required=True)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.listen, args.backend))
    return 0


if __name__ == "__main__":
    sys.exit(main())

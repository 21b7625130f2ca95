"""A small program for the tracer's own test: a value handed on from task to task, through a
thread, to a socket, beside work that must not count.

The path: ``main`` starts ``produce`` and ``relay``; ``produce`` computes the value (with
``helper``, a leaf) and puts it on a queue; ``relay`` gets it, sends it to the ``worker``
thread, awaits the future that the worker resolves on the loop, then writes the result to a
socket (the terminal). Off the path: ``side`` (a task ``produce`` starts, which sets an event
nobody on the path waits for), ``tick`` (a task beside it all, setting its own event), and
``after_work`` (what the worker does after handing the value back).
"""

from __future__ import annotations

import asyncio
import queue
import threading


def helper(x: int) -> int:
    return 2 * x


async def produce(items: asyncio.Queue, noticed: asyncio.Event) -> None:
    value = helper(21)
    asyncio.get_running_loop().create_task(side(noticed))
    await asyncio.sleep(0)
    items.put_nowait(value)


async def side(noticed: asyncio.Event) -> None:
    noticed.set()


async def tick(ticks: asyncio.Event, stop: asyncio.Event) -> None:
    while not stop.is_set():
        ticks.set()
        await asyncio.sleep(0.001)


def worker(
    inbox: queue.Queue, loop: asyncio.AbstractEventLoop, done: asyncio.Future, log: queue.Queue
) -> None:
    value = inbox.get()
    loop.call_soon_threadsafe(done.set_result, value + 1)
    after_work(log)


def after_work(log: queue.Queue) -> None:
    log.put("handed on")


async def relay(items: asyncio.Queue, inbox: queue.Queue, done: asyncio.Future, port: int) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    value = await items.get()
    inbox.put(value)
    result = await done
    writer.write(f"{result}\n".encode())  # the terminal
    await writer.drain()
    writer.close()


async def main() -> str:
    """Run the flow; the text the socket's other end received."""
    received: asyncio.Future = asyncio.get_running_loop().create_future()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.set_result((await reader.readline()).decode().strip())
        writer.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    stop, ticks, noticed = asyncio.Event(), asyncio.Event(), asyncio.Event()
    ticker = asyncio.create_task(tick(ticks, stop))
    loop, inbox, log = asyncio.get_running_loop(), queue.Queue(), queue.Queue()
    done = loop.create_future()
    thread = threading.Thread(target=worker, args=(inbox, loop, done, log))
    thread.start()
    items: asyncio.Queue = asyncio.Queue()
    await asyncio.gather(produce(items, noticed), relay(items, inbox, done, port))
    text = await received
    stop.set()
    await ticker
    await asyncio.to_thread(thread.join)
    server.close()
    return text

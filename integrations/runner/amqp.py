"""AMQP (RabbitMQ) consumer plumbing of the runner's queue trigger: plain values in and out.

A `Consumer` owns one pika BlockingConnection and channel on a durable queue, consumes with
manual acknowledgements and a prefetch window, and hands out batches of `Message`s. Settling a
batch is the caller's decision: `ack_through` after the messages are safely stored,
`requeue_through` when storing failed, `drop` for a message that can never be stored.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass

import pika
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import AMQPError
from pika.spec import Basic, BasicProperties

# pika narrates every connection step at INFO: keep its warnings and errors only.
logging.getLogger("pika").setLevel(logging.WARNING)

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


@dataclass(frozen=True)
class Message:
    delivery_tag: int
    body: bytes
    message_id: str
    redelivered: bool


class Consumer:
    """One consumer on `queue` (declared durable); messages stay unacked until settled."""

    def __init__(self, url: str, queue: str, *, prefetch: int = 100, heartbeat: int = 60) -> None:
        params = pika.URLParameters(url)
        params.heartbeat = heartbeat
        params.connection_attempts = 3
        params.retry_delay = 1
        self.queue = queue
        self._connection = pika.BlockingConnection(params)
        self._channel: BlockingChannel = self._connection.channel()
        self._channel.queue_declare(queue=queue, durable=True)
        self._channel.basic_qos(prefetch_count=max(prefetch, 1))
        self._buffer: collections.deque[Message] = collections.deque()
        self._consumer_tag: str | None = self._channel.basic_consume(
            queue=queue, on_message_callback=self._on_message, auto_ack=False
        )

    def _on_message(
        self, _channel: BlockingChannel, method: Basic.Deliver, props: BasicProperties, body: bytes
    ) -> None:
        self._buffer.append(
            Message(
                delivery_tag=int(method.delivery_tag or 0),
                body=body,
                message_id=str(props.message_id or ""),
                redelivered=bool(method.redelivered),
            )
        )

    def fetch(self, max_messages: int, window: float = 0.5) -> list[Message]:
        """Up to `max_messages` messages: returns once that many arrived or `window` seconds passed."""
        deadline = time.monotonic() + window
        while len(self._buffer) < max_messages and self._consumer_tag is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._connection.process_data_events(time_limit=left)
        return [self._buffer.popleft() for _ in range(min(max_messages, len(self._buffer)))]

    def ack_through(self, delivery_tag: int) -> None:
        """Acknowledge every unsettled message up to and including `delivery_tag` (multiple=True)."""
        self._channel.basic_ack(delivery_tag=delivery_tag, multiple=True)

    def requeue_through(self, delivery_tag: int) -> None:
        """Give every unsettled message up to `delivery_tag` back to the queue (redelivered later)."""
        self._channel.basic_nack(delivery_tag=delivery_tag, multiple=True, requeue=True)

    def drop(self, delivery_tag: int) -> None:
        """Refuse one message for good: not requeued (dead-lettered if the queue is set up for it)."""
        self._channel.basic_nack(delivery_tag=delivery_tag, multiple=False, requeue=False)

    def sleep(self, seconds: float) -> None:
        """Wait while keeping the connection alive (heartbeats are answered)."""
        self._connection.sleep(seconds)

    def stop(self) -> None:
        """Stop receiving: the broker sends nothing more; messages received but not fetched go back."""
        if self._consumer_tag is not None:
            self._channel.basic_cancel(self._consumer_tag)
            self._consumer_tag = None
        while self._buffer:
            self._channel.basic_nack(delivery_tag=self._buffer.popleft().delivery_tag, requeue=True)

    def close(self) -> None:
        """Stop and close; whatever is still unacked is requeued by the broker."""
        try:
            if self._connection.is_open:
                self.stop()
                self._connection.close()
        except AMQPError:
            pass


def publish(url: str, queue: str, bodies: list[bytes], *, message_ids: list[str] | None = None) -> None:
    """Publish persistent messages to a durable queue (scripts and tests)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.queue_declare(queue=queue, durable=True)
        channel.confirm_delivery()
        for i, body in enumerate(bodies):
            props = pika.BasicProperties(
                delivery_mode=pika.DeliveryMode.Persistent,
                message_id=message_ids[i] if message_ids else None,
            )
            channel.basic_publish(exchange="", routing_key=queue, body=body, properties=props)
    finally:
        connection.close()


def queue_counts(url: str, queue: str) -> tuple[int, int]:
    """(messages ready, consumers) of an existing queue."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ok = connection.channel().queue_declare(queue=queue, passive=True).method
        return int(ok.message_count), int(ok.consumer_count)
    finally:
        connection.close()


def queue_delete(url: str, queue: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        connection.channel().queue_delete(queue=queue)
    finally:
        connection.close()

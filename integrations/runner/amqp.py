"""AMQP (RabbitMQ) consumer plumbing of the runner's queue trigger: plain values in and out.

A `Consumer` owns one pika BlockingConnection and channel on a durable queue, consumes with
manual acknowledgements and a prefetch window, and hands out batches of `Message`s. Settling a
batch is the caller's decision, made once per batch: `settle` takes an `Outcome` per message
(ACK once stored, REQUEUE when storing failed, DROP for a message that can never be stored) and
sends the broker the calls of `settlement_plan`, which never names a delivery tag the channel does
not hold unsettled (RabbitMQ closes the channel on such a tag: 406 PRECONDITION_FAILED).

The queue is adopted as it is when it exists (a passive declare: whatever arguments or policy its
operator gave it, e.g. its own `x-dead-letter-exchange`); only a missing queue is declared, durable,
with a dead-letter route to `<queue>.dead` (`dead_letter_queue`), so a message refused with DROP
(nack without requeue) is dead-lettered there by the broker. A body larger than `max_bytes` is
not kept once received (`Message.oversize`), so a window of big messages never fills the memory.

A channel or connection that goes away (broker restart, connection drop, channel error, the
queue deleted under the consumer) raises `ConsumerLost` from whatever call meets it, instead of
leaving a consumer that receives nothing; `reconnect` opens a new connection and channel.
Delivery tags count per channel: a message received on an earlier channel is never settled on
a later one (the broker already gave it back to the queue when that channel closed).
"""

from __future__ import annotations

import collections
import enum
import logging
import os
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pika
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import AMQPError, ChannelClosedByBroker
from pika.spec import Basic, BasicProperties

# pika narrates every connection step at INFO: keep its warnings and errors only.
logging.getLogger("pika").setLevel(logging.WARNING)

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
DEFAULT_MAX_BYTES = 1024 * 1024
NOT_FOUND = 404
# content_encoding values a body may carry: None/"" and identity as they are, gzip decompressed.
GZIP_ENCODINGS = frozenset({"gzip", "x-gzip"})
IDENTITY_ENCODINGS = frozenset({"", "identity"})


@dataclass(frozen=True)
class Message:
    delivery_tag: int
    body: bytes
    message_id: str
    redelivered: bool
    channel: int = 0  # which of the consumer's channels delivered it (tags count per channel)
    content_encoding: str = ""
    oversize: int = 0  # the size of a body too large to keep (then `body` is empty)


class Undecodable(ValueError):
    """A body that cannot be decoded: an unknown content_encoding, corrupt gzip, or larger than allowed."""


def decoded_body(message: Message, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The message's body as sent (gzip undone), never more than `max_bytes`; raises Undecodable.

    Decompression stops at `max_bytes` + 1 output bytes: a gzip bomb costs at most that much."""
    if message.oversize:
        raise Undecodable(f"the body ({message.oversize} bytes) is larger than {max_bytes} bytes")
    encoding = message.content_encoding.strip().lower()
    if encoding in IDENTITY_ENCODINGS:
        body = message.body
    elif encoding in GZIP_ENCODINGS:
        body = _gunzip(message.body, max_bytes)
    else:
        raise Undecodable(f"unknown content_encoding {message.content_encoding[:40]!r} (gzip or none)")
    if len(body) > max_bytes:
        raise Undecodable(f"the body is larger than {max_bytes} bytes")
    return body


def _gunzip(data: bytes, max_bytes: int) -> bytes:
    """Every gzip member of `data`, up to `max_bytes` + 1 bytes of output in all."""
    out = bytearray()
    while data:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += inflater.decompress(data, max_bytes + 1 - len(out))
        except zlib.error as exc:
            raise Undecodable(f"the gzip body is corrupt: {exc}") from None
        if len(out) > max_bytes:
            raise Undecodable(f"the body is larger than {max_bytes} bytes once decompressed")
        if not inflater.eof:
            raise Undecodable("the gzip body is truncated")
        data = inflater.unused_data
    return bytes(out)


def dead_letter_queue(queue: str) -> str:
    """Where the messages a queue the consumer declared refuses are dead-lettered."""
    return f"{queue}.dead"


def open_queue(connection: pika.BlockingConnection, queue: str) -> BlockingChannel:
    """A channel on `queue`: adopted as it is if it exists, else declared durable with a dead-letter
    route to `dead_letter_queue(queue)` (declared too). Never re-declares an existing queue, so
    its operator's arguments never end the channel with 406 PRECONDITION_FAILED."""
    channel = _adopt(connection, queue)
    if channel is not None:
        return channel
    dead = dead_letter_queue(queue)
    channel = _adopt(connection, dead)
    if channel is None:
        channel = connection.channel()
        channel.queue_declare(queue=dead, durable=True)
    arguments = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}
    try:
        channel.queue_declare(queue=queue, durable=True, arguments=arguments)
    except ChannelClosedByBroker:  # declared meanwhile by someone else, otherwise: adopt theirs
        channel = _adopt(connection, queue)
        if channel is None:
            raise
    return channel


def _adopt(connection: pika.BlockingConnection, queue: str) -> BlockingChannel | None:
    """A channel on the existing `queue` (passive declare), or None if there is no such queue."""
    channel = connection.channel()
    try:
        channel.queue_declare(queue=queue, passive=True)
    except ChannelClosedByBroker as exc:
        if exc.reply_code != NOT_FOUND:
            raise
        return None
    return channel


class Outcome(enum.Enum):
    """What becomes of a delivered message."""

    ACK = "ack"  # stored (or already stored): the broker forgets it
    REQUEUE = "requeue"  # not stored this time: back to the queue, delivered again
    DROP = "drop"  # can never be stored: refused, not requeued (dead-lettered if the queue has a DLX)


@dataclass(frozen=True)
class Settle:
    """One basic.ack / basic.nack: `multiple` settles every unsettled tag up to `delivery_tag`."""

    outcome: Outcome
    delivery_tag: int
    multiple: bool


def settlement_plan(unsettled: Iterable[int], decisions: Mapping[int, Outcome]) -> list[Settle]:
    """The broker calls, in order, that settle each decided tag once with its outcome and nothing else.

    `unsettled` is every tag the channel delivered and nobody settled yet; `decisions` maps some of
    them to an outcome (a decided tag that is not unsettled is left out: settling it again would
    close the channel). Consecutive unsettled tags with one outcome are settled by one call with
    multiple=True, but only while no undecided tag lies below them: a multiple call reaches every
    unsettled tag at or below its own.
    """
    plan: list[Settle] = []
    run: list[int] = []
    run_outcome: Outcome | None = None
    undecided_below = False

    def flush() -> None:
        if not run or run_outcome is None:
            return
        if len(run) > 1 and not undecided_below:
            plan.append(Settle(run_outcome, run[-1], multiple=True))
        else:
            plan.extend(Settle(run_outcome, tag, multiple=False) for tag in run)
        run.clear()

    for tag in sorted(set(unsettled)):
        outcome = decisions.get(tag)
        if outcome is None:
            flush()
            undecided_below = True
            continue
        if outcome is not run_outcome:
            flush()
            run_outcome = outcome
        run.append(tag)
    flush()
    return plan


class ConsumerLost(Exception):
    """The channel or connection is gone (or the broker cancelled the consumer): reconnect."""


class Consumer:
    """One consumer on `queue` (declared durable); messages stay unacked until settled."""

    def __init__(
        self,
        url: str,
        queue: str,
        *,
        prefetch: int = 100,
        heartbeat: int = 60,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.url = url
        self.queue = queue
        self.max_bytes = max_bytes
        self.prefetch = max(prefetch, 1)
        self.heartbeat = heartbeat
        self._buffer: collections.deque[Message] = collections.deque()
        self._unsettled: set[int] = set()
        self._channel_no = 0
        self._consumer_tag: str | None = None
        self._cancelled = False
        self._connect()

    def _connect(self) -> None:
        params = pika.URLParameters(self.url)
        params.heartbeat = self.heartbeat
        params.connection_attempts = 1
        # Names the connection in the broker's tools (rabbitmqctl list_connections client_properties).
        params.client_properties = {"connection_name": f"runner_consume {self.queue} pid {os.getpid()}"}
        self._connection = pika.BlockingConnection(params)
        try:
            self._channel: BlockingChannel = open_queue(self._connection, self.queue)
            self._channel.basic_qos(prefetch_count=self.prefetch)
            self._channel.add_on_cancel_callback(self._on_cancel)
            self._channel_no += 1
            self._buffer.clear()
            self._unsettled.clear()
            self._cancelled = False
            self._consumer_tag = self._channel.basic_consume(
                queue=self.queue, on_message_callback=self._on_message, auto_ack=False
            )
        except BaseException:
            self._close_quietly()
            raise

    def reconnect(self) -> None:
        """A new connection and channel consuming the queue; raises AMQPError if the broker refuses."""
        self._close_quietly()
        self._connect()

    def _on_message(
        self, _channel: BlockingChannel, method: Basic.Deliver, props: BasicProperties, body: bytes
    ) -> None:
        tag = int(method.delivery_tag or 0)
        self._unsettled.add(tag)
        oversize = len(body) if len(body) > self.max_bytes else 0
        self._buffer.append(
            Message(
                delivery_tag=tag,
                body=b"" if oversize else body,
                message_id=str(props.message_id or ""),
                redelivered=bool(method.redelivered),
                channel=self._channel_no,
                content_encoding=str(props.content_encoding or ""),
                oversize=oversize,
            )
        )

    def _on_cancel(self, _frame: object) -> None:
        self._cancelled = True  # the queue was deleted, or its node went away

    def _check(self) -> None:
        if not self._connection.is_open:
            raise ConsumerLost("the connection is closed")
        if not self._channel.is_open:
            reason = getattr(self._channel, "_closing_reason", None)
            raise ConsumerLost(f"the channel is closed: {reason or 'no reason given'}")
        if self._cancelled:
            raise ConsumerLost(f"the broker cancelled the consumer of {self.queue!r} (queue deleted?)")

    def fetch(self, max_messages: int, window: float = 0.5) -> list[Message]:
        """Up to `max_messages` messages: returns once that many arrived or `window` seconds passed.

        Raises ConsumerLost when the channel or connection is gone."""
        deadline = time.monotonic() + window
        try:
            while len(self._buffer) < max_messages and self._consumer_tag is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._connection.process_data_events(time_limit=left)
                if self._consumer_tag is not None:
                    self._check()
        except AMQPError as exc:
            raise ConsumerLost(f"{type(exc).__name__}: {exc}") from exc
        return [self._buffer.popleft() for _ in range(min(max_messages, len(self._buffer)))]

    def settle(self, outcomes: Iterable[tuple[Message, Outcome]]) -> None:
        """Settle messages of this channel as decided (see `settlement_plan`); raises ConsumerLost."""
        decisions = {m.delivery_tag: o for m, o in outcomes if m.channel == self._channel_no}
        plan = settlement_plan(self._unsettled, decisions)
        try:
            for call in plan:
                if call.outcome is Outcome.ACK:
                    self._channel.basic_ack(delivery_tag=call.delivery_tag, multiple=call.multiple)
                else:
                    requeue = call.outcome is Outcome.REQUEUE
                    self._channel.basic_nack(
                        delivery_tag=call.delivery_tag, multiple=call.multiple, requeue=requeue
                    )
                if call.multiple:
                    self._unsettled.difference_update([t for t in self._unsettled if t <= call.delivery_tag])
                else:
                    self._unsettled.discard(call.delivery_tag)
            self._check()
        except AMQPError as exc:
            raise ConsumerLost(f"{type(exc).__name__}: {exc}") from exc

    def sleep(self, seconds: float) -> None:
        """Wait while keeping the connection alive (heartbeats are answered); raises ConsumerLost."""
        try:
            self._connection.sleep(seconds)
            self._check()
        except AMQPError as exc:
            raise ConsumerLost(f"{type(exc).__name__}: {exc}") from exc

    def stop(self) -> None:
        """Stop receiving: the broker sends nothing more; messages received but not fetched go back."""
        try:
            if self._consumer_tag is not None:
                self._consumer_tag, tag = None, self._consumer_tag
                self._channel.basic_cancel(tag)
        except AMQPError as exc:
            raise ConsumerLost(f"{type(exc).__name__}: {exc}") from exc
        back, self._buffer = list(self._buffer), collections.deque()
        self.settle((m, Outcome.REQUEUE) for m in back)

    def close(self) -> None:
        """Stop and close; whatever is still unacked is requeued by the broker."""
        try:
            if self._connection.is_open and self._channel.is_open:
                self.stop()
        except ConsumerLost:
            pass
        self._close_quietly()

    def _close_quietly(self) -> None:
        connection = getattr(self, "_connection", None)
        try:
            if connection is not None and connection.is_open:
                connection.close()
        except AMQPError:
            pass


def publish(
    url: str,
    queue: str,
    bodies: list[bytes],
    *,
    message_ids: list[str] | None = None,
    content_encoding: str | None = None,
) -> None:
    """Publish persistent messages to a durable queue (scripts and tests); an empty id sets none."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = open_queue(connection, queue)
        channel.confirm_delivery()
        for i, body in enumerate(bodies):
            props = pika.BasicProperties(
                delivery_mode=pika.DeliveryMode.Persistent,
                message_id=(message_ids[i] or None) if message_ids else None,
                content_encoding=content_encoding,
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

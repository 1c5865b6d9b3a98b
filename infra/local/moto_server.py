"""moto server, as infra/local/moto.sh starts it: moto's own `moto_server`, with the DynamoDB
API's requests to one table handled one at a time.

DynamoDB applies the writes to one item one after another: a conditional write, or an `ADD`
that returns the new value, is atomic. moto's server is threaded and its DynamoDB backend takes
no lock, so two such writes to one item at once can both read the same old value (seen: two
rate bookings of the delivery-cap store given the same start, in
`delivery_caps::the_dynamodb_cap_store_keeps_the_contract_of_the_in_memory_one`). The tests
check gridrelay against DynamoDB's contract, so the emulator is made to keep it: a lock per
table around each DynamoDB request (a request naming several tables takes theirs in name
order). One lock for all tables, as before, made every test's DynamoDB calls wait for every
other's: with tests/it run six at a time, invocations ran out of time and messages were parked.
The other services, and SQS's long polls, are not held by any of them (each SQS queue has a
lock of its own, below).

SQS holds back a FIFO queue's message group while one of its messages is in flight; once a
message's visibility ends it is back in the queue. moto keeps every message it handed out in its
pending set until a receive walks past it, and takes the group for held while any of them is
there: messages of one group whose visibility ended together (an invocation stopped, a worker
killed) were skipped one by one until the last, which was handed out first, out of the group's
order (O1; `tests/it/ordering.rs`
`a_keys_messages_whose_visibility_ends_together_come_back_in_order_o1`). And a long poll that
began while the group was held kept taking it for held until a held message came back, which it
then handed out alone, before the group's first. A receive on a FIFO queue here drops from the
pending set the messages whose visibility has ended, then asks moto without waiting, and waits
(polling every 50 ms) itself, so each try sees the group as it is. moto also decides which
groups are held once, as a receive begins: two receives at once could each hand out a part of
one group, the second a later part while the first was in flight (seen in the chaos run: a key's
event delivered before seven earlier ones; `tests/it/ordering.rs`
`concurrent_receives_never_hand_out_a_groups_message_while_an_earlier_is_in_flight_o1`), and a
delete rebuilds the queue's list of messages from what it read, so two at once can put back what
the other deleted (or a send's message, on any queue). A queue's sends, deletes and visibility
changes here, and a FIFO queue's receive tries, take their turns, one at a time per queue, as
SQS's are atomic. And moto reads the clock
for each message it looks at: a message whose visibility ended between the check of what is
held and the walk through the queue made it skip a group's visible first messages and hand out
the ones from that message on (seen in the chaos run: a key's first, back from a hold, passed
over for its later events). A receive's try here reads the clock once: every message is seen as
it was at that instant.

moto refuses a Firehose stream past 50 in a region, a fixed number; AWS's quota per account and
region is a default that can be raised, and LocalStack has none. A local stack has six streams
(the journal's and one per archive retention class), and the suites run several stacks at once
in one account: the limit here is 1,000.
"""

import contextlib
import json
import sys
import threading
import time

from moto.dynamodb.responses import DynamoHandler
from moto.firehose.models import DeliveryStream
from moto.server import main
import moto.sqs.models as sqs_models
from moto.sqs.models import SQSBackend

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
_call_action = DynamoHandler.call_action


def _lock_of(table: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(table, threading.Lock())


def _tables(body) -> list[str]:
    """The tables a DynamoDB request names, in name order."""
    try:
        request = json.loads(body or "{}")
    except (TypeError, ValueError):
        return []
    if not isinstance(request, dict):
        return []
    names = set()
    if isinstance(request.get("TableName"), str):
        names.add(request["TableName"])
    if isinstance(request.get("RequestItems"), dict):
        names.update(request["RequestItems"])
    for item in request.get("TransactItems") or []:
        for operation in item.values() if isinstance(item, dict) else []:
            if isinstance(operation, dict) and isinstance(operation.get("TableName"), str):
                names.add(operation["TableName"])
    return sorted(names)


def _serialized_call_action(self):
    with contextlib.ExitStack() as held:
        for table in _tables(self.body):
            held.enter_context(_lock_of(table))
        return _call_action(self)


DynamoHandler.call_action = _serialized_call_action

_queue_locks: dict[str, threading.RLock] = {}


def _queue_lock(queue) -> threading.RLock:
    with _locks_guard:
        return _queue_locks.setdefault(queue.queue_arn, threading.RLock())


def _one_at_a_time(method):
    """`method` of SQSBackend (its first argument the queue's name), one call at a time per
    queue."""

    def wrapped(self, queue_name, *args, **kwargs):
        with _queue_lock(self.get_queue(queue_name)):
            return method(self, queue_name, *args, **kwargs)

    return wrapped


for _name in (
    "send_message",
    "send_message_batch",
    "delete_message",
    "delete_message_batch",
    "change_message_visibility",
    "change_message_visibility_batch",
):
    setattr(SQSBackend, _name, _one_at_a_time(getattr(SQSBackend, _name)))

_clock = sqs_models.unix_time_millis
_frozen = threading.local()


def _millis(*args, **kwargs):
    """moto's SQS clock: the instant the current thread's receive try began, if it is in one."""
    at = getattr(_frozen, "millis", None)
    return at if at is not None and not args and not kwargs else _clock(*args, **kwargs)


sqs_models.unix_time_millis = _millis

_receive_message = SQSBackend.receive_message


def _receive_in_group_order(
    self, queue_name, count, wait_seconds_timeout, visibility_timeout, message_attribute_names=None
):
    queue = self.get_queue(queue_name)
    if not queue.fifo_queue:
        return _receive_message(
            self, queue_name, count, wait_seconds_timeout, visibility_timeout, message_attribute_names
        )
    end = time.monotonic() + (wait_seconds_timeout or 0)
    while True:
        with _queue_lock(queue):
            outer = getattr(_frozen, "millis", None)
            _frozen.millis = outer if outer is not None else _clock()
            try:
                for message in [m for m in queue.pending_messages if m.visible]:
                    queue.pending_messages.discard(message)
                received = _receive_message(
                    self, queue_name, count, 0, visibility_timeout, message_attribute_names
                )
            finally:
                _frozen.millis = outer
        if received or time.monotonic() >= end:
            return received
        time.sleep(0.05)


SQSBackend.receive_message = _receive_in_group_order
DeliveryStream.MAX_STREAMS_PER_REGION = 1000

if __name__ == "__main__":
    sys.exit(main())

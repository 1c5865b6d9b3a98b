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
SQS's long polls and the other services are not held by any of them.
"""

import contextlib
import json
import sys
import threading

from moto.dynamodb.responses import DynamoHandler
from moto.server import main

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

if __name__ == "__main__":
    sys.exit(main())

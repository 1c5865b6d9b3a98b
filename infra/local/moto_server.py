"""moto server, as infra/local/moto.sh starts it: moto's own `moto_server`, with the DynamoDB
API's requests handled one at a time.

DynamoDB applies the writes to one item one after another: a conditional write, or an `ADD`
that returns the new value, is atomic. moto's server is threaded and its DynamoDB backend takes
no lock, so two such writes to one item at once can both read the same old value (seen: two
rate bookings of the delivery-cap store given the same start, in
`delivery_caps::the_dynamodb_cap_store_keeps_the_contract_of_the_in_memory_one`). The tests
check gridrelay against DynamoDB's contract, so the emulator is made to keep it: one lock
around each DynamoDB request (they are short; SQS's long polls and the other services are not
held by it).
"""

import sys
import threading

from moto.dynamodb.responses import DynamoHandler
from moto.server import main

_one_at_a_time = threading.Lock()
_call_action = DynamoHandler.call_action


def _serialized_call_action(self):
    with _one_at_a_time:
        return _call_action(self)


DynamoHandler.call_action = _serialized_call_action

if __name__ == "__main__":
    sys.exit(main())

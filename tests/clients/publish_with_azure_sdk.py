"""Publishes with Microsoft's own Event Grid client library, unmodified.

Usage: publish_with_azure_sdk.py ENDPOINT KEY COUNT [key|sas|cloudevents]
Sends one event, then a batch of COUNT-1, through EventGridPublisherClient, authenticated as an
Event Grid user would: with the key (AzureKeyCredential, the aeg-sas-key header) or with a
shared access signature the SDK generates from the key (generate_sas + AzureSasCredential, the
aeg-sas-token header). With `cloudevents`, the events are azure.core's CloudEvent (the SDK sends
them as application/cloudevents-batch+json), for a topic whose input schema is CloudEvents.
"""
import sys
from datetime import datetime, timedelta, timezone

from azure.core.credentials import AzureKeyCredential, AzureSasCredential
from azure.core.messaging import CloudEvent
from azure.eventgrid import EventGridEvent, EventGridPublisherClient, generate_sas

endpoint, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "key"
if mode == "sas":
    expiry = datetime.now(timezone.utc) + timedelta(hours=1)
    credential = AzureSasCredential(generate_sas(endpoint, key, expiry))
else:
    credential = AzureKeyCredential(key)
client = EventGridPublisherClient(endpoint, credential)
if mode == "cloudevents":
    client.send(CloudEvent(source="/contoso/doors", type="Contoso.Items.ItemReceived",
                           subject="door/0", data={"n": 0}))
    client.send([CloudEvent(source="/contoso/doors", type="Contoso.Items.ItemReceived",
                            subject=f"door/{i}", data={"n": i}) for i in range(1, count)])
    print("sent", count, "with", mode)
    sys.exit(0)
client.send(EventGridEvent(event_type="Contoso.Items.ItemReceived", subject="door/0",
                           data={"n": 0}, data_version="2.0"))
client.send([EventGridEvent(event_type="Contoso.Items.ItemReceived", subject=f"door/{i}",
                            data={"n": i}, data_version="2.0") for i in range(1, count)])
print("sent", count, "with", mode)

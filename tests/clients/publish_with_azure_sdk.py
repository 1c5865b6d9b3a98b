"""Publishes with Microsoft's own Event Grid client library, unmodified.

Usage: publish_with_azure_sdk.py ENDPOINT KEY COUNT
Sends one event, then a batch of COUNT-1, through EventGridPublisherClient with an
AzureKeyCredential (the aeg-sas-key header), as an Event Grid user would.
"""
import sys

from azure.core.credentials import AzureKeyCredential
from azure.eventgrid import EventGridEvent, EventGridPublisherClient

endpoint, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = EventGridPublisherClient(endpoint, AzureKeyCredential(key))
client.send(EventGridEvent(event_type="Contoso.Items.ItemReceived", subject="door/0",
                           data={"n": 0}, data_version="2.0"))
client.send([EventGridEvent(event_type="Contoso.Items.ItemReceived", subject=f"door/{i}",
                            data={"n": i}, data_version="2.0") for i in range(1, count)])
print("sent", count)

//! What `show`, `list`, `create` and `update` print: records shaped like `az eventgrid`'s
//! output, so scripts written for `az` keep working, and a table for people.
//!
//! An event subscription is printed with Event Grid's property names and nesting
//! (`provisioningState`, `destination.endpointUrl`, `filter.advancedFilters[].value(s)`,
//! nested models flattened as `az` prints them, with no `properties` level,
//! `retryPolicy`, `deadLetterDestination`, `eventDeliverySchema`, `labels`,
//! `expirationTimeUtc`, …), unset properties as `null` as `az` prints them; what gridrelay has
//! beyond Event Grid (`statusTable`, `deliveryCaps`, `signing`, `endpointChange`,
//! `provisioningDetail`) sits beside them under names `az` does not use. Endpoint URLs are
//! printed without credentials or query string (`***` says they are there): those stay in the
//! store.

use chrono::{DateTime, Utc};
use gridrelay_shared::delivery_attributes::DeliveryAttributeMapping;
use gridrelay_shared::filter::EventFilter;
use gridrelay_shared::health::EndpointHealth;
use gridrelay_shared::outbound::redact_endpoint;
use gridrelay_shared::subscription::{Subscription, Topic, publish_path, topic_resource_id};
use serde_json::{Value, json};

/// `type` of a topic, as Event Grid names it.
pub const TOPIC_TYPE: &str = "Microsoft.EventGrid/topics";
/// `type` of an event subscription, as Event Grid names it.
pub const SUBSCRIPTION_TYPE: &str = "Microsoft.EventGrid/eventSubscriptions";

/// The resource id of a subscription: its topic's, then `/eventSubscriptions/NAME`.
pub fn subscription_id(topic: &str, name: &str) -> String {
    format!("{}/eventSubscriptions/{name}", topic_resource_id(topic))
}

/// A topic as `az eventgrid topic show` prints one (keys only when asked for).
pub fn topic_view(topic: &Topic, publish_url: &str, with_keys: bool) -> Value {
    let mut v = json!({
        "id": topic.resource_id(),
        "name": topic.name,
        "type": TOPIC_TYPE,
        "provisioningState": "Succeeded",
        "endpoint": format!("{}{}", publish_url.trim_end_matches('/'), publish_path(&topic.name)),
        "inputSchema": topic.input_schema,
        "inputSchemaMapping": topic.input_mapping.as_ref().map(|m| json!({
            "inputSchemaMappingType": "Json",
            "id": {"sourceField": m.id_field},
            "topic": {"sourceField": m.topic_field},
            "eventTime": {"sourceField": m.event_time_field},
            "subject": {"sourceField": m.subject_field, "defaultValue": m.default_subject},
            "eventType": {"sourceField": m.event_type_field, "defaultValue": m.default_event_type},
            "dataVersion": {"sourceField": m.data_version_field, "defaultValue": m.default_data_version},
        })),
        "tags": (!topic.tags.is_empty()).then_some(&topic.tags),
        "eventRetentionInDays": topic.retention_days,
        "dedupWindowInSeconds": topic.dedup_window_seconds,
        "systemData": {"createdAt": topic.created_at},
    });
    if with_keys {
        v["key1"] = json!(topic.key1);
        v["key2"] = json!(topic.key2);
    }
    v
}

/// An event subscription as `az eventgrid event-subscription show` prints one.
pub fn subscription_view(sub: &Subscription) -> Value {
    let mut v = json!({
        "id": subscription_id(&sub.topic, &sub.name),
        "name": sub.name,
        "type": SUBSCRIPTION_TYPE,
        "topic": topic_resource_id(&sub.topic),
        "provisioningState": sub.provisioning.state,
        "destination": destination_view(sub),
        "filter": filter_view(&sub.filter),
        "labels": (!sub.labels.is_empty()).then_some(&sub.labels),
        "expirationTimeUtc": sub.expiration_time_utc,
        "eventDeliverySchema": sub.event_delivery_schema,
        "retryPolicy": {
            "maxDeliveryAttempts": sub.retry_policy.max_delivery_attempts,
            "eventTimeToLiveInMinutes": sub.retry_policy.event_time_to_live_in_minutes,
        },
        "deadLetterDestination": sub.dead_letter_destination.as_ref().map(|d| json!({
            "endpointType": "S3",
            "bucket": d.bucket,
            "prefix": d.prefix,
            "url": d.url(),
        })),
        "deadLetterWithResourceIdentity": null,
        "deliveryWithResourceIdentity": null,
        "systemData": {"createdAt": sub.created_at},
        // gridrelay's own.
        "provisioningDetail": sub.provisioning.detail,
        "statusTable": sub.status_table,
        "subscriptionInstanceId": sub.id,
        "journalAnswerBytes": sub.answer_bytes_kept(),
        // O1: null when events are delivered without order.
        "orderingKey": sub.ordering_key,
    });
    if !sub.delivery_caps.is_unset() {
        v["deliveryCaps"] = json!(sub.delivery_caps);
    }
    if let Some(signing) = &sub.signing {
        // Secret ids (where the secrets are kept), never the secrets.
        v["signing"] = json!(signing);
    }
    if let Some(auth) = &sub.delivery_auth {
        // A1: the client secret's id, never the secret; the token URL without its query.
        let mut shown = json!(auth);
        if let Some(url) = shown.get_mut("tokenUrl") {
            *url = json!(redact_endpoint(&auth.client_credentials().token_url));
        }
        v["deliveryAuth"] = shown;
    }
    if let Some(change) = &sub.endpoint_change {
        v["endpointChange"] = json!({
            "endpointUrl": redact_endpoint(&change.endpoint),
            "provisioningState": change.provisioning.state,
            "provisioningDetail": change.provisioning.detail,
            "requestedAt": change.requested_at,
        });
    }
    v
}

/// Where a subscription's events go: a webhook as `az` prints one; an AWS resource by its ARN
/// (`resourceId`, as `az` names an Azure resource's), with the batch settings where they
/// apply (a Lambda function).
fn destination_view(sub: &Subscription) -> Value {
    let endpoint_type = sub.endpoint_type;
    if endpoint_type.is_resource() {
        let mut d = json!({
            "endpointType": endpoint_type.as_str(),
            "resourceId": sub.endpoint,
        });
        if endpoint_type.takes_batches() {
            d["maxEventsPerBatch"] = json!(sub.batching.max_events_per_batch);
            d["preferredBatchSizeInKilobytes"] =
                json!(sub.batching.preferred_batch_size_in_kilobytes);
        }
        return d;
    }
    json!({
        "endpointType": endpoint_type.as_str(),
        "endpointUrl": redact_endpoint(&sub.endpoint),
        "endpointBaseUrl": endpoint_base_url(&sub.endpoint),
        "maxEventsPerBatch": sub.batching.max_events_per_batch,
        "preferredBatchSizeInKilobytes": sub.batching.preferred_batch_size_in_kilobytes,
        "deliveryAttributeMappings": mappings_view(&sub.delivery_attribute_mappings),
        "azureActiveDirectoryTenantId": null,
        "azureActiveDirectoryApplicationIdOrUri": null,
    })
}

/// The delivery queue's approximate message counts (SQS's), for every subscription.
pub struct QueueCounts {
    pub visible: Option<u64>,
    pub delayed: Option<u64>,
    pub in_flight: Option<u64>,
}

/// What `show` says of delivery to a subscription: its endpoint's health, its host's, its
/// token endpoint's (A1: an OAuth subscription's) and the delivery queue's counts (`null`
/// where there is none or it could not be read).
pub fn delivery_status_view(
    health: Option<&EndpointHealth>,
    host: Option<&EndpointHealth>,
    token: Option<&EndpointHealth>,
    queue: Option<&QueueCounts>,
    now: DateTime<Utc>,
) -> Value {
    let last_failure = |h: &EndpointHealth| {
        h.last_failure.map(|f| {
            json!({
                "at": f.at,
                "outcome": f.outcome,
                "status": f.status,
            })
        })
    };
    let state = |h: &EndpointHealth| {
        if h.delayed_until.is_some_and(|t| t > now) {
            "Delayed"
        } else if h.is_healthy() {
            "Healthy"
        } else {
            "Failing"
        }
    };
    json!({
        // #34 item 8: a host found hung holds every URL of it, whatever each URL's own record.
        "host": host.map(|h| json!({
            "state": state(h),
            "delayedUntil": h.delayed_until,
        })),
        "endpoint": health.map(|h| json!({
            "state": state(h),
            "consecutiveFailures": h.consecutive_failures,
            "delayedUntil": h.delayed_until,
            "lastFailure": last_failure(h),
        })),
        // A1: token failures since the last token; they never delay delivery, so a token
        // endpoint is only healthy or failing.
        "token": token.map(|t| json!({
            "state": if t.is_healthy() { "Healthy" } else { "Failing" },
            "consecutiveFailures": t.consecutive_failures,
            "lastFailure": last_failure(t),
        })),
        "deliveryQueue": queue.map(|q| json!({
            "scope": "all subscriptions",
            "approximateMessages": q.visible,
            "approximateMessagesDelayed": q.delayed,
            "approximateMessagesInFlight": q.in_flight,
        })),
    })
}

/// The URL without credentials, query string or fragment (`az`'s `endpointBaseUrl`).
fn endpoint_base_url(endpoint: &str) -> Value {
    url::Url::parse(endpoint)
        .ok()
        .map(|u| {
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!(
                "{}://{}{port}{}",
                u.scheme(),
                u.host_str().unwrap_or_default(),
                u.path()
            )
        })
        .into()
}

/// Delivery headers as Event Grid nests them; a secret's value is never printed.
fn mappings_view(mappings: &[DeliveryAttributeMapping]) -> Value {
    if mappings.is_empty() {
        return Value::Null;
    }
    mappings
        .iter()
        .map(|m| {
            if m.is_dynamic() {
                json!({"name": m.name, "type": m.kind, "sourceField": m.source_field})
            } else {
                json!({"name": m.name, "type": m.kind, "value": m.value, "isSecret": m.is_secret})
            }
        })
        .collect()
}

/// A filter as Event Grid prints it: one-value operators with `value`, the others with
/// `values`, `IsNullOrUndefined` and `IsNotNull` with neither.
fn filter_view(filter: &EventFilter) -> Value {
    let advanced: Vec<Value> = filter
        .advanced_filters
        .iter()
        .map(|f| {
            let mut v = serde_json::to_value(f).unwrap_or_default();
            if let Some(object) = v.as_object_mut()
                && let Some(values) = object.remove("values")
            {
                let name = if values.is_array() { "values" } else { "value" };
                object.insert(name.to_string(), values);
            }
            v
        })
        .collect();
    json!({
        "includedEventTypes": filter.included_event_types,
        "subjectBeginsWith": filter.subject_begins_with.as_deref().unwrap_or(""),
        "subjectEndsWith": filter.subject_ends_with.as_deref().unwrap_or(""),
        "isSubjectCaseSensitive": filter.is_subject_case_sensitive,
        "enableAdvancedFilteringOnArrays": filter.enable_advanced_filtering_on_arrays,
        "advancedFilters": (!advanced.is_empty()).then_some(advanced),
    })
}

/// Rows of a table with a header line, each column as wide as its widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = vec![
        line(header.iter().map(|h| h.to_string()).collect()),
        line(widths.iter().map(|w| "-".repeat(*w)).collect()),
    ];
    out.extend(rows.iter().map(|r| line(r.clone())));
    out.join("\n")
}

/// `--output table` of event subscriptions.
pub fn subscriptions_table(subs: &[Subscription]) -> String {
    let rows: Vec<Vec<String>> = subs
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                format!("{:?}", s.provisioning.state),
                if s.endpoint_type.is_resource() {
                    s.endpoint.clone()
                } else {
                    redact_endpoint(&s.endpoint)
                },
                s.event_delivery_schema.as_str().to_string(),
                s.batching.max_events_per_batch.to_string(),
                s.retry_policy.max_delivery_attempts.to_string(),
                s.expiration_time_utc
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default(),
            ]
        })
        .collect();
    table(
        &[
            "Name",
            "ProvisioningState",
            "EndpointUrl",
            "EventDeliverySchema",
            "MaxEventsPerBatch",
            "MaxDeliveryAttempts",
            "ExpirationTimeUtc",
        ],
        &rows,
    )
}

/// `--output table` of topics.
pub fn topics_table(topics: &[Topic], publish_url: &str) -> String {
    let rows: Vec<Vec<String>> = topics
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                "Succeeded".to_string(),
                t.input_schema.as_str().to_string(),
                t.retention_days.to_string(),
                t.dedup_window_seconds.to_string(),
                format!(
                    "{}{}",
                    publish_url.trim_end_matches('/'),
                    publish_path(&t.name)
                ),
            ]
        })
        .collect();
    table(
        &[
            "Name",
            "ProvisioningState",
            "InputSchema",
            "RetentionDays",
            "DedupWindowSeconds",
            "Endpoint",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridrelay_shared::delivery_attributes::DeliveryAttributeRequest;
    use gridrelay_shared::filter::AdvancedFilter;
    use gridrelay_shared::schema::InputSchema;
    use gridrelay_shared::subscription::SubscriptionRequest;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    /// #12: an AWS resource destination prints its type and ARN as `resourceId` (no handshake:
    /// provisioned at once), with batch settings only where they apply.
    #[test]
    fn a_resource_destination_prints_its_type_and_arn_s4() {
        let now = chrono::Utc::now();
        let sub = |endpoint: &str| {
            SubscriptionRequest {
                topic: "orders".into(),
                name: "audit".into(),
                endpoint: endpoint.into(),
                ..SubscriptionRequest::default()
            }
            .validate(InputSchema::EventGridSchema, now)
            .unwrap()
        };
        let queue = sub("arn:aws:sqs:us-east-1:123456789012:orders");
        let v = subscription_view(&queue);
        assert_eq!(v["provisioningState"], "Succeeded");
        assert_eq!(
            v["destination"],
            json!({"endpointType": "SqsQueue", "resourceId": "arn:aws:sqs:us-east-1:123456789012:orders"})
        );
        let function = sub("arn:aws:lambda:us-east-1:123456789012:function:f");
        let d = &subscription_view(&function)["destination"];
        assert_eq!(d["endpointType"], "LambdaFunction");
        assert_eq!(d["maxEventsPerBatch"], 1);
        assert!(
            subscriptions_table(&[queue]).contains("arn:aws:sqs:us-east-1:123456789012:orders")
        );
    }

    /// #11 item 13: the properties scripts written for `az eventgrid event-subscription show`
    /// read are where they read them; the endpoint's secrets and secret header values are not
    /// printed.
    #[test]
    fn a_subscription_prints_in_az_eventgrid_shape() {
        let now = chrono::Utc::now();
        let sub = SubscriptionRequest {
            topic: "orders".into(),
            name: "audit".into(),
            endpoint: "https://user:pw@hooks.example.com/in?code=s3cret".into(),
            max_events_per_batch: Some(10),
            max_delivery_attempts: Some(5),
            dead_letter_destination: Some("s3://dead/orders".into()),
            labels: vec!["team".into()],
            filter: EventFilter {
                included_event_types: Some(vec!["Created".into()]),
                advanced_filters: vec![
                    AdvancedFilter::parse("data.n", "NumberGreaterThan", &words(&["5"])).unwrap(),
                    AdvancedFilter::parse("data.s", "StringIn", &words(&["a", "b"])).unwrap(),
                    AdvancedFilter::parse("data.x", "IsNotNull", &[]).unwrap(),
                ],
                ..EventFilter::default()
            },
            delivery_attributes: vec![
                DeliveryAttributeRequest::parse(&words(&["X-A", "static", "v"])).unwrap(),
                DeliveryAttributeRequest::parse(&words(&["X-S", "static", "hidden", "secret"]))
                    .unwrap(),
                DeliveryAttributeRequest::parse(&words(&["X-D", "dynamic", "data.t"])).unwrap(),
            ],
            ..SubscriptionRequest::default()
        }
        .validate(InputSchema::EventGridSchema, now)
        .unwrap();
        let v = subscription_view(&sub);
        assert_eq!(v["id"], "/gridrelay/topics/orders/eventSubscriptions/audit");
        assert_eq!(v["type"], "Microsoft.EventGrid/eventSubscriptions");
        assert_eq!(v["topic"], "/gridrelay/topics/orders");
        assert_eq!(v["provisioningState"], "Creating");
        let d = &v["destination"];
        assert_eq!(d["endpointType"], "WebHook");
        assert_eq!(d["endpointUrl"], "https://***@hooks.example.com/in?***");
        assert_eq!(d["endpointBaseUrl"], "https://hooks.example.com/in");
        assert_eq!(d["maxEventsPerBatch"], 10);
        assert_eq!(d["preferredBatchSizeInKilobytes"], 64);
        assert_eq!(
            d["deliveryAttributeMappings"],
            json!([
                {"name": "X-A", "type": "Static", "value": "v", "isSecret": false},
                {"name": "X-S", "type": "Static", "value": null, "isSecret": true},
                {"name": "X-D", "type": "Dynamic", "sourceField": "data.t"},
            ])
        );
        assert!(!v.to_string().contains("s3cret") && !v.to_string().contains("hidden"));
        assert_eq!(
            v["filter"]["advancedFilters"],
            json!([
                {"key": "data.n", "operatorType": "NumberGreaterThan", "value": 5.0},
                {"key": "data.s", "operatorType": "StringIn", "values": ["a", "b"]},
                {"key": "data.x", "operatorType": "IsNotNull"},
            ])
        );
        assert_eq!(v["filter"]["includedEventTypes"], json!(["Created"]));
        assert_eq!(v["filter"]["subjectBeginsWith"], "");
        assert_eq!(
            v["retryPolicy"],
            json!({"maxDeliveryAttempts": 5, "eventTimeToLiveInMinutes": 1440})
        );
        assert_eq!(v["deadLetterDestination"]["url"], "s3://dead/orders");
        assert_eq!(v["eventDeliverySchema"], "EventGridSchema");
        assert_eq!(v["labels"], json!(["team"]));
        assert_eq!(v["expirationTimeUtc"], Value::Null);
        assert_eq!(v["statusTable"], "Latest");
    }

    /// #11 item 14: what `show` says of delivery: the endpoint's state, failures, delay and
    /// last failure; the queue's counts; `null` for what could not be read.
    #[test]
    fn delivery_status_says_how_delivery_goes() {
        use gridrelay_shared::classify::DeliveryOutcome;
        use gridrelay_shared::health::LastFailure;
        let now = chrono::Utc::now();
        let failure = LastFailure {
            at: now,
            outcome: DeliveryOutcome::Busy,
            status: Some(503),
        };
        let delayed = EndpointHealth {
            consecutive_failures: 12,
            delayed_until: Some(now + chrono::Duration::minutes(4)),
            probe_until: None,
            last_failure: Some(failure),
        };
        let v = delivery_status_view(
            Some(&delayed),
            Some(&delayed),
            None,
            Some(&QueueCounts {
                visible: Some(3),
                delayed: Some(40),
                in_flight: None,
            }),
            now,
        );
        assert_eq!(v["endpoint"]["state"], "Delayed");
        assert_eq!(v["host"]["state"], "Delayed");
        assert_eq!(v["endpoint"]["consecutiveFailures"], 12);
        assert_eq!(v["endpoint"]["lastFailure"]["outcome"], "Busy");
        assert_eq!(v["endpoint"]["lastFailure"]["status"], 503);
        assert_eq!(v["deliveryQueue"]["approximateMessagesDelayed"], 40);
        assert_eq!(
            v["deliveryQueue"]["approximateMessagesInFlight"],
            Value::Null
        );
        let recovered = delayed.after_success();
        let v = delivery_status_view(Some(&recovered), None, None, None, now);
        assert_eq!(v["endpoint"]["state"], "Healthy");
        assert_eq!(
            v["endpoint"]["lastFailure"]["status"], 503,
            "kept after a success"
        );
        assert_eq!(v["deliveryQueue"], Value::Null);
        assert_eq!(v["host"], Value::Null);
        let v = delivery_status_view(None, None, None, None, now);
        assert_eq!(v["endpoint"], Value::Null);
        assert_eq!(v["token"], Value::Null, "no OAuth, no token record");
    }

    /// A1: an OAuth subscription's token endpoint as `show` says it: failing with its count
    /// and last failure (the token endpoint's status), then healthy with the last failure kept.
    #[test]
    fn delivery_status_says_how_tokens_come_a1() {
        use gridrelay_shared::oauth::{TokenFailure, after_token_failure};
        let now = chrono::Utc::now();
        let down = TokenFailure::Refused {
            status: 503,
            error: None,
        };
        let failing = [0, 1].iter().fold(EndpointHealth::default(), |r, _| {
            after_token_failure(&r, &down, now)
        });
        let v = delivery_status_view(None, None, Some(&failing), None, now);
        assert_eq!(v["token"]["state"], "Failing");
        assert_eq!(v["token"]["consecutiveFailures"], 2);
        assert_eq!(v["token"]["lastFailure"]["outcome"], "TokenUnavailable");
        assert_eq!(v["token"]["lastFailure"]["status"], 503);
        let v = delivery_status_view(None, None, Some(&failing.after_success()), None, now);
        assert_eq!(v["token"]["state"], "Healthy");
        assert_eq!(v["token"]["consecutiveFailures"], 0);
        assert_eq!(v["token"]["lastFailure"]["status"], 503);
    }

    /// #11 item 13: `--output table` lines up its columns under a header.
    #[test]
    fn tables_line_up_their_columns() {
        let t = table(
            &["Name", "State"],
            &[
                vec!["a".into(), "Succeeded".into()],
                vec!["longer-name".into(), "Failed".into()],
            ],
        );
        assert_eq!(
            t,
            "Name         State\n-----------  ---------\na            Succeeded\nlonger-name  Failed"
        );
    }
}

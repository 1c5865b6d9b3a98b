//! The subscribers' portal (#36) from the command line: `event-subscription portal-link`
//! makes a link that shows one subscription's deliveries, and `portal-key rotate` revokes
//! every link made before.

use anyhow::Context;
use clap::{Args, Subcommand};
use gridrelay_adapters::aws::{
    DynamoSubscriptionStore, load_sdk_config, portal_key, rotate_portal_key,
};
use gridrelay_adapters::config::TableNames;
use gridrelay_ports::SubscriptionStore;
use gridrelay_shared::journal::format_time;
use gridrelay_shared::portal::{PortalGrant, parse_link_lifetime};
use serde_json::json;

use crate::{OutputFormat, invalid, print_as, store_error};

#[derive(Args)]
pub(crate) struct PortalLink {
    #[arg(long)]
    topic_name: String,
    #[arg(long)]
    name: String,
    /// How long the link works: minutes, hours or days (30m, 24h, 7d), from 5 minutes to 30
    /// days. Rotating the portal key (`gridrelay portal-key rotate`) ends every link sooner.
    #[arg(long, default_value = "24h")]
    expires_in: String,
    /// A link to look only: its page shows the deliveries and offers no test event, no send
    /// again and no rotation (the portal refuses them with it).
    #[arg(long)]
    view_only: bool,
}

#[derive(Subcommand)]
pub(crate) enum PortalKeyCommand {
    /// Put a new random key in the portal key's secret: every portal link made before is
    /// refused once the portal reads it (within the configuration cache's time).
    Rotate,
}

/// Where the portal's links point and what signs them.
pub(crate) struct PortalPlaces<'a> {
    pub(crate) tables: TableNames,
    /// Where the portal's pages are (`--portal-url`, or the publish URL's `/portal`).
    pub(crate) portal_url: &'a str,
    pub(crate) key_secret: &'a str,
}

/// `event-subscription portal-link`: a link to the subscription's portal page, signed, until
/// `--expires-in` from now.
pub(crate) async fn portal_link(
    args: &PortalLink,
    places: &PortalPlaces<'_>,
    output: OutputFormat,
) -> anyhow::Result<()> {
    let lifetime = parse_link_lifetime(&args.expires_in, "--expires-in").map_err(invalid)?;
    let sdk = load_sdk_config().await;
    let store = DynamoSubscriptionStore::from_sdk(&sdk, places.tables.clone());
    let (url, grant) = signed_link(
        &sdk,
        &store,
        (places.portal_url, places.key_secret),
        (&args.topic_name, &args.name),
        (lifetime, args.view_only),
    )
    .await?;
    let view = json!({
        "url": url,
        "topic": grant.topic,
        "subscription": grant.subscription,
        "expiresAt": format_time(grant.expires_at),
        "viewOnly": grant.view_only,
    });
    print_as(output, &view, || {
        format!(
            "{url}\n\nworks until {} for subscription {} of topic {} only{}",
            format_time(grant.expires_at),
            grant.subscription,
            grant.topic,
            if grant.view_only {
                ", to look only"
            } else {
                ""
            }
        )
    })
}

/// The link to subscription `(topic, name)`'s page (it, by its id) for `lifetime` (checked
/// already), view-only if `view_only`, under the portal's pages at `portal_url`, signed with the key
/// in `key_secret`, if the subscription exists; and its grant (`portal-link`'s, and the
/// console's).
pub(crate) async fn signed_link(
    sdk: &aws_config::SdkConfig,
    store: &dyn SubscriptionStore,
    (portal_url, key_secret): (&str, &str),
    (topic, name): (&str, &str),
    (lifetime, view_only): (chrono::TimeDelta, bool),
) -> anyhow::Result<(String, PortalGrant)> {
    let sub = store
        .get_subscription(topic, name)
        .await
        .map_err(store_error)?
        .with_context(|| format!("event subscription {name} on topic {topic} does not exist"))?;
    let grant = PortalGrant {
        view_only,
        ..PortalGrant::new(&sub, chrono::Utc::now(), lifetime, "--expires-in").map_err(invalid)?
    };
    let key = portal_key(sdk, key_secret).await.with_context(|| {
        format!(
            "could not read the portal key secret {key_secret} (--portal-key-secret, the \
             stack's PortalKeySecret output)"
        )
    })?;
    let url = format!(
        "{}?token={}",
        gridrelay_portal::page_url(portal_url, &grant.topic, &grant.subscription),
        grant.token(&key)
    );
    Ok((url, grant))
}

/// `portal-key rotate`.
pub(crate) async fn rotate_key(key_secret: &str, output: OutputFormat) -> anyhow::Result<()> {
    let sdk = load_sdk_config().await;
    rotate_portal_key(&sdk, key_secret)
        .await
        .with_context(|| format!("could not rotate the portal key secret {key_secret}"))?;
    let view = json!({
        "rotated": key_secret,
        "rotatedAt": format_time(chrono::Utc::now()),
    });
    print_as(output, &view, || {
        format!("rotated {key_secret}: every portal link made before is refused from now on")
    })
}

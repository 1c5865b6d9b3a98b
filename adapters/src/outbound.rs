//! The outbound rules ([`gridrelay_shared::outbound`]) at connect time, in the sender's
//! connector.
//!
//! [`OutboundConnector`] resolves the endpoint's host itself (an address in any spelling is
//! that address; a name goes to its [`AddressResolver`]), checks every address against the
//! [`OutboundPolicy`], and hands the connector inside it only addresses that passed, as
//! literal IPs, so nothing resolves the name a second time: what was checked is what is
//! connected to, whatever the name's DNS says by then (rebinding). TLS still verifies and
//! names the server by the URL's host (the TLS layer wraps this connector). A host whose
//! addresses are all refused fails with the [`Refusal`], which the sender reports as a refused
//! attempt ([`gridrelay_shared::classify::AttemptResult::Refused`]).

use std::future::{Future, poll_fn};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use http::Uri;

use crate::descriptors::BoxError;
use gridrelay_ports::endpoints::AddressResolver;
use gridrelay_shared::outbound::{Host, OutboundPolicy, Refusal, Transport, parse_host};

/// The system's resolver (`getaddrinfo`, as the HTTP client's own would be).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait]
impl AddressResolver for SystemResolver {
    async fn resolve(&self, host: &str, port: u16) -> Result<Vec<IpAddr>, String> {
        tokio::net::lookup_host((host, port))
            .await
            .map(|addrs| addrs.map(|a| a.ip()).collect())
            .map_err(|e| e.to_string())
    }
}

/// The endpoint's host could not be resolved.
#[derive(Debug, thiserror::Error)]
#[error("the endpoint's host could not be resolved: {0}")]
pub struct Unresolved(String);

/// A connector that connects only to addresses the policy allows.
#[derive(Debug, Clone)]
pub struct OutboundConnector<C> {
    inner: C,
    policy: Arc<OutboundPolicy>,
    resolver: Arc<dyn AddressResolver>,
}

impl<C> OutboundConnector<C> {
    pub fn new(inner: C, policy: Arc<OutboundPolicy>, resolver: Arc<dyn AddressResolver>) -> Self {
        Self {
            inner,
            policy,
            resolver,
        }
    }
}

impl<C> tower_service::Service<Uri> for OutboundConnector<C>
where
    C: tower_service::Service<Uri> + Clone + Send + 'static,
    C::Future: Send,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let mut inner = self.inner.clone();
        let policy = self.policy.clone();
        let resolver = self.resolver.clone();
        Box::pin(async move {
            let transport = match dst.scheme_str() {
                Some("https") => Transport::Https,
                _ => Transport::Http,
            };
            let port = dst.port_u16().unwrap_or(match transport {
                Transport::Https => 443,
                Transport::Http => 80,
            });
            let host = dst
                .host()
                .and_then(parse_host)
                .ok_or("the endpoint has no valid host")?;
            let addresses = match host {
                Host::Address(ip) => vec![ip],
                Host::Name(name) => resolver.resolve(&name, port).await.map_err(Unresolved)?,
            };
            // Addresses the policy refuses are never connected to; if some were allowed, the
            // last connection error is the answer (the endpoint is reachable in principle).
            let (mut refused, mut failed): (Option<Refusal>, Option<BoxError>) = (None, None);
            for ip in addresses {
                if let Err(refusal) = policy.check(transport, ip) {
                    refused.get_or_insert(refusal);
                    continue;
                }
                let mut parts = dst.clone().into_parts();
                parts.authority = Some(SocketAddr::new(ip, port).to_string().parse()?);
                let literal = Uri::from_parts(parts)?;
                poll_fn(|cx| inner.poll_ready(cx))
                    .await
                    .map_err(Into::into)?;
                match inner.call(literal).await {
                    Ok(connection) => return Ok(connection),
                    Err(e) => failed = Some(e.into()),
                }
            }
            Err(failed
                .or_else(|| refused.map(|r| Box::new(r) as BoxError))
                .unwrap_or_else(|| Box::new(Unresolved("it resolves to no address".into()))))
        })
    }
}

/// The refusal in `e`'s chain of sources, if a connection was refused by the policy.
pub fn refusal_in(e: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
    let mut current = Some(e);
    while let Some(e) = current {
        if let Some(refusal) = e.downcast_ref::<Refusal>() {
            return Some(*refusal);
        }
        current = e.source();
    }
    None
}

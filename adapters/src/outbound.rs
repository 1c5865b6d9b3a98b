//! The outbound rules ([`gridrelay_shared::outbound`]) at connect time, in the sender's
//! connector.
//!
//! [`OutboundConnector`] resolves the endpoint's host itself (an address in any spelling is
//! that address; a name goes to its [`AddressResolver`]), checks every address against the
//! [`OutboundPolicy`], and hands `hyper`'s TCP connector only the addresses that passed, as
//! its resolver's answer, so nothing resolves the name a second time: what was checked is
//! what is connected to, whatever the name's DNS says by then (rebinding), and the TCP
//! connector still races IPv6 and IPv4 and falls back to the next address as it would. TLS
//! still verifies and names the server by the URL's host (the TLS layer wraps this
//! connector). A host whose addresses are all refused fails with the policy's
//! [`gridrelay_shared::outbound::Refusal`], which the sender reports as a refused attempt
//! ([`gridrelay_shared::classify::AttemptResult::Refused`]).

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::descriptors::BoxError;
use gridrelay_ports::endpoints::AddressResolver;
use gridrelay_shared::outbound::{OutboundPolicy, endpoint_target};

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
pub struct OutboundConnector {
    policy: Arc<OutboundPolicy>,
    resolver: Arc<dyn AddressResolver>,
}

impl OutboundConnector {
    pub fn new(policy: Arc<OutboundPolicy>, resolver: Arc<dyn AddressResolver>) -> Self {
        Self { policy, resolver }
    }
}

/// The addresses that passed the policy, as the TCP connector's resolver: it then connects as
/// it would to a name (both families raced, the next address on failure) but only to these.
#[derive(Debug, Clone)]
struct CheckedAddresses(Vec<SocketAddr>);

impl tower_service::Service<Name> for CheckedAddresses {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _name: Name) -> Self::Future {
        ready(Ok(self.0.clone().into_iter()))
    }
}

/// The TCP connector for one connection, to `addresses` only.
fn tcp(addresses: Vec<SocketAddr>) -> HttpConnector<CheckedAddresses> {
    let mut tcp = HttpConnector::new_with_resolver(CheckedAddresses(addresses));
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    // A connection kept idle for the next burst finds out when its peer is gone.
    tcp.set_keepalive(Some(Duration::from_secs(15)));
    tcp.set_keepalive_interval(Some(Duration::from_secs(15)));
    tcp.set_keepalive_retries(Some(3));
    tcp
}

impl tower_service::Service<Uri> for OutboundConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let policy = self.policy.clone();
        let resolver = self.resolver.clone();
        Box::pin(async move {
            let (transport, host, port) = endpoint_target(&dst.to_string())?;
            let addresses = resolver.addresses(&host, port).await.map_err(Unresolved)?;
            // Addresses the policy refuses are never connected to; the others are.
            let (allowed, refused) = policy.sort(transport, addresses);
            if allowed.is_empty() {
                return Err(match refused {
                    Some((_, refusal)) => Box::new(refusal) as BoxError,
                    None => Box::new(Unresolved("it resolves to no address".into())),
                });
            }
            let allowed = allowed
                .into_iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect();
            // A host in a standard spelling is an address the TCP connector reads as the one
            // checked; any other host goes to `CheckedAddresses`, never to DNS.
            let mut tcp = tcp(allowed);
            Ok(tcp.call(dst).await?)
        })
    }
}

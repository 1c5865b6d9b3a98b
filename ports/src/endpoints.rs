//! Which endpoints a subscription may be created with: the outbound rules of
//! [`gridrelay_shared::outbound`] applied when the subscription is registered, so an endpoint
//! that names or resolves to a private address, or plain `http://` outside the allowed networks,
//! is refused at once with the reason instead of failing its handshake later. The deliver
//! function checks every connection again (the name may resolve elsewhere by then).

use std::net::IpAddr;

use async_trait::async_trait;

use gridrelay_shared::limits::LimitError;
use gridrelay_shared::outbound::{Host, OutboundPolicy, Refusal, endpoint_target};

/// Names to addresses (the system's resolver in the functions and the command line).
#[async_trait]
pub trait AddressResolver: Send + Sync + std::fmt::Debug {
    /// Every address `host` resolves to, for a connection to `port`.
    async fn resolve(&self, host: &str, port: u16) -> Result<Vec<IpAddr>, String>;

    /// The addresses a URL's host stands for: itself, or what its name resolves to.
    async fn addresses(&self, host: &Host, port: u16) -> Result<Vec<IpAddr>, String> {
        match host {
            Host::Address(ip) => Ok(vec![*ip]),
            Host::Name(name) => self.resolve(name, port).await,
        }
    }
}

/// Whether an endpoint may be registered.
#[async_trait]
pub trait EndpointGate: Send + Sync {
    /// `Ok` if events may be sent to `endpoint`; the error names the host and why not.
    async fn admit(&self, endpoint: &str) -> Result<(), LimitError>;
}

/// The outbound policy on the addresses an endpoint's host resolves to now: every one must be
/// allowed (a name that does not resolve here is left to the handshake). Stricter than at
/// connect time, where a name's refused addresses are skipped and its allowed ones used: a
/// subscription is not created for a name that points into a private network at all. The
/// error names the address the name resolved to: it goes to the user who typed the name, from
/// their own resolver, and is not stored.
pub struct EndpointCheck {
    pub policy: OutboundPolicy,
    pub resolver: std::sync::Arc<dyn AddressResolver>,
}

#[async_trait]
impl EndpointGate for EndpointCheck {
    async fn admit(&self, endpoint: &str) -> Result<(), LimitError> {
        let (transport, host, port) = endpoint_target(endpoint)?;
        // A name that does not resolve from here is left to the handshake, which connects from
        // the deliver function (its network and DNS may differ from this machine's) and fails
        // the subscription if it cannot reach it; every connection is checked.
        let Ok(addresses) = self.resolver.addresses(&host, port).await else {
            return Ok(());
        };
        let Some((ip, refusal)) = self.policy.sort(transport, addresses).1 else {
            return Ok(());
        };
        let why = match (&host, refusal) {
            (Host::Address(_), Refusal::Address(kind)) => format!("{ip}, {kind}"),
            (Host::Name(name), Refusal::Address(kind)) => {
                format!("{name}, which resolves to {ip}, {kind}")
            }
            (Host::Address(_), Refusal::PlainHttp) => format!("plain http:// to {ip}"),
            (Host::Name(name), Refusal::PlainHttp) => format!("plain http:// to {name}"),
        };
        Err(LimitError::new(
            "endpoint",
            why,
            format!(
                "https:// to a public address, or any address in the allowed networks ({}; \
                 --allowed-networks, GRIDRELAY_ALLOWED_NETWORKS)",
                self.policy.allowed
            ),
        ))
    }
}

/// Admits every endpoint: for in-memory tests and simulations, whose endpoints are names that
/// resolve nowhere.
pub struct AnyEndpoint;

#[async_trait]
impl EndpointGate for AnyEndpoint {
    async fn admit(&self, _endpoint: &str) -> Result<(), LimitError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryResolver;
    use gridrelay_shared::outbound::AllowedNetworks;

    async fn admit(policy: &OutboundPolicy, endpoint: &str) -> Result<(), LimitError> {
        let resolver = std::sync::Arc::new(MemoryResolver::default());
        resolver.set("hooks.example.com", &["52.95.110.1"]);
        resolver.set("internal.example.com", &["52.95.110.1", "10.0.0.7"]);
        resolver.set("metadata.example.com", &["169.254.169.254"]);
        EndpointCheck {
            policy: policy.clone(),
            resolver,
        }
        .admit(endpoint)
        .await
    }

    #[test]
    fn private_and_plain_http_endpoints_are_refused_naming_host_and_reason() {
        futures::executor::block_on(refused());
    }

    async fn refused() {
        let strict = OutboundPolicy::default();
        admit(&strict, "https://hooks.example.com/x").await.unwrap();
        // Left to the handshake, which connects from the deliver function's network.
        admit(&strict, "https://nowhere.example.com/x")
            .await
            .unwrap();
        for (endpoint, says) in [
            (
                "http://127.0.0.1:8080/hook",
                "127.0.0.1, a loopback address",
            ),
            ("https://0x7f.1/hook", "127.0.0.1, a loopback address"),
            ("https://[::ffff:169.254.169.254]/", "link-local"),
            (
                "https://metadata.example.com/",
                "resolves to 169.254.169.254",
            ),
            // One private address among public ones is enough to refuse.
            (
                "https://internal.example.com/",
                "10.0.0.7, a private address",
            ),
            (
                "http://hooks.example.com/x",
                "plain http:// to hooks.example.com",
            ),
        ] {
            let e = admit(&strict, endpoint).await.unwrap_err();
            assert_eq!(e.field, "endpoint");
            assert!(e.value.contains(says), "{endpoint}: {e}");
            assert!(e.allowed.contains("allowed networks (none"), "{e}");
        }
    }

    #[test]
    fn the_allowed_networks_admit_their_addresses_over_http() {
        futures::executor::block_on(admitted());
    }

    async fn admitted() {
        let local = OutboundPolicy::new(AllowedNetworks::loopback());
        admit(&local, "http://127.0.0.1:8080/hook").await.unwrap();
        admit(&local, "http://[::1]:8080/hook").await.unwrap();
        let e = admit(&local, "http://10.0.0.7/").await.unwrap_err();
        assert!(e.allowed.contains("127.0.0.0/8,::1/128"), "{e}");
    }
}

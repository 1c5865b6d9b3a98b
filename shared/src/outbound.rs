//! Where gridrelay may send: the addresses an outbound request may connect to, and when plain
//! `http://` is allowed.
//!
//! Endpoint URLs are typed by gridrelay's users, and the functions run inside someone's network
//! (a VPC, next to the instance metadata service), so a URL that names or resolves to a private
//! address would make gridrelay a proxy into that network (server-side request forgery). Every
//! connection — deliveries, the validation handshake, the CloudEvents OPTIONS handshake — is
//! checked here on the address it is about to connect to, after DNS, so a name that resolved to
//! a public address at validation and to `127.0.0.1` later (DNS rebinding) is still refused.
//!
//! [`address_kind`] sorts every IPv4 and IPv6 address, looking through the IPv6 forms that carry
//! an IPv4 address (mapped `::ffff:a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`).
//! [`OutboundPolicy`] refuses every kind but [`AddressKind::Public`] unless the address is in its
//! [`AllowedNetworks`], and plain `http://` outside them (endpoints must be `https://`, as in
//! Event Grid). [`parse_host`] reads a URL's host the way browsers do (WHATWG), so `2130706433`,
//! `0x7f.1`, `0177.0.0.1` and `127.0.0.1.` are the address they spell and are never handed to a
//! resolver that might read them differently.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::IpNet;

use crate::limits::LimitError;

/// What an address is, as far as reaching it from gridrelay goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressKind {
    /// A globally routed unicast address.
    Public,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// RFC 1918 (`10/8`, `172.16/12`, `192.168/16`), unique-local `fc00::/7`, site-local
    /// `fec0::/10`.
    Private,
    /// `169.254/16` (EC2 instance metadata `169.254.169.254`, the ECS and EKS credential
    /// endpoints `169.254.170.2` and `169.254.170.23`), `fe80::/10`.
    LinkLocal,
    /// Carrier-grade NAT, `100.64/10` (RFC 6598).
    SharedAddressSpace,
    /// `224/4`, `ff00::/8`.
    Multicast,
    /// `0.0.0.0/8`, `::`.
    Unspecified,
    /// Documentation, benchmarking, broadcast, IETF-reserved and deprecated ranges, and IPv6
    /// outside global unicast `2000::/3`.
    Reserved,
}

impl fmt::Display for AddressKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Public => "a public address",
            Self::Loopback => "a loopback address",
            Self::Private => "a private address (RFC 1918 or unique-local)",
            Self::LinkLocal => "a link-local address (where cloud metadata services live)",
            Self::SharedAddressSpace => "a carrier-grade NAT address (RFC 6598)",
            Self::Multicast => "a multicast address",
            Self::Unspecified => "an unspecified address",
            Self::Reserved => "a reserved address",
        })
    }
}

/// What `ip` is; IPv6 forms that carry an IPv4 address are that IPv4 address's kind.
pub fn address_kind(ip: IpAddr) -> AddressKind {
    match ip {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => v6_kind(v6),
    }
}

fn v4_kind(ip: Ipv4Addr) -> AddressKind {
    use AddressKind::*;
    match ip.octets() {
        [0, ..] => Unspecified,
        [127, ..] => Loopback,
        [10, ..] | [172, 16..=31, ..] | [192, 168, ..] => Private,
        [169, 254, ..] => LinkLocal,
        [100, 64..=127, ..] => SharedAddressSpace,
        [224..=239, ..] => Multicast,
        // 240/4 and the broadcast address; IETF protocol assignments; TEST-NET-1, 2 and 3;
        // the 6to4 relay anycast; benchmarking.
        [240..=255, ..]
        | [192, 0, 0, _]
        | [192, 0, 2, _]
        | [198, 51, 100, _]
        | [203, 0, 113, _]
        | [192, 88, 99, _]
        | [198, 18..=19, ..] => Reserved,
        _ => Public,
    }
}

fn v6_kind(ip: Ipv6Addr) -> AddressKind {
    use AddressKind::*;
    if let Some(v4) = ip.to_ipv4_mapped() {
        return v4_kind(v4);
    }
    let s = ip.segments();
    let embedded =
        |hi: u16, lo: u16| v4_kind(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)));
    match s {
        [0, 0, 0, 0, 0, 0, 0, 0] => Unspecified,
        [0, 0, 0, 0, 0, 0, 0, 1] => Loopback,
        // NAT64's well-known prefix: the last 32 bits are the IPv4 address reached.
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => embedded(hi, lo),
        // 6to4: bits 16..48 are the IPv4 address of the relay.
        [0x2002, hi, lo, ..] => embedded(hi, lo),
        _ if s[0] & 0xfe00 == 0xfc00 || s[0] & 0xffc0 == 0xfec0 => Private,
        _ if s[0] & 0xffc0 == 0xfe80 => LinkLocal,
        _ if s[0] & 0xff00 == 0xff00 => Multicast,
        // Documentation (2001:db8::/32, 3fff::/20), IETF protocol assignments including Teredo
        // (2001::/23), and everything outside global unicast (IPv4-compatible ::/96, the
        // discard prefix 100::/64, local-use NAT64 64:ff9b:1::/48, …).
        [0x2001, 0x0db8, ..] => Reserved,
        [0x2001, b, ..] if b < 0x0200 => Reserved,
        [0x3fff, b, ..] if b < 0x1000 => Reserved,
        _ if s[0] & 0xe000 != 0x2000 => Reserved,
        _ => Public,
    }
}

/// Networks gridrelay may reach although they are not public (and where plain `http://` is
/// allowed): a comma-separated list of CIDRs or single addresses, as the stack parameter
/// `AllowedNetworks`, `GRIDRELAY_ALLOWED_NETWORKS` and `--allowed-networks` take it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedNetworks(Vec<IpNet>);

/// The setting's name in errors.
pub const ALLOWED_NETWORKS_FIELD: &str = "allowed networks";

/// What `gridrelay local` allows unless told otherwise: loopback, so subscribers on the same
/// machine keep working.
pub const LOCAL_ALLOWED_NETWORKS: &str = "127.0.0.0/8,::1/128";

impl AllowedNetworks {
    /// None: only public addresses, over `https://`.
    pub fn none() -> Self {
        Self::default()
    }

    /// Loopback only ([`LOCAL_ALLOWED_NETWORKS`]).
    pub fn loopback() -> Self {
        LOCAL_ALLOWED_NETWORKS
            .parse()
            .unwrap_or_else(|_| Self::none())
    }

    /// Whether `ip`, or the IPv4 address an IPv4-mapped `ip` carries, is in one of them.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let canonical = ip.to_canonical();
        self.0
            .iter()
            .any(|net| net.contains(&ip) || net.contains(&canonical))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromStr for AllowedNetworks {
    type Err = LimitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut nets = Vec::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let net = item
                .parse::<IpNet>()
                .or_else(|_| item.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    LimitError::new(
                        ALLOWED_NETWORKS_FIELD,
                        format!("{item:?}"),
                        "comma-separated CIDRs or addresses, like 10.0.0.0/8,fd00::/8,192.0.2.7",
                    )
                })?;
            nets.push(net.trunc());
        }
        Ok(Self(nets))
    }
}

impl fmt::Display for AllowedNetworks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let nets: Vec<String> = self.0.iter().map(IpNet::to_string).collect();
        f.write_str(&nets.join(","))
    }
}

/// Why a connection was not made. Says what to change, never the address itself (a refusal
/// detail must not work as a map of someone's internal network).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "refused: the endpoint resolves to {0}, and gridrelay sends only to public addresses and \
         its allowed networks (AllowedNetworks, GRIDRELAY_ALLOWED_NETWORKS)"
    )]
    Address(AddressKind),
    #[error(
        "refused: plain http:// to an address outside the allowed networks; endpoints must be \
         https:// (or in AllowedNetworks, GRIDRELAY_ALLOWED_NETWORKS)"
    )]
    PlainHttp,
}

/// Whether a request goes over TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Https,
    Http,
}

/// Which addresses outbound requests may connect to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboundPolicy {
    pub allowed: AllowedNetworks,
}

impl OutboundPolicy {
    pub fn new(allowed: AllowedNetworks) -> Self {
        Self { allowed }
    }

    /// The addresses of `ips` a request over `transport` may connect to, in their order, and
    /// the first it may not with why ([`OutboundPolicy::check`]).
    pub fn sort(
        &self,
        transport: Transport,
        ips: impl IntoIterator<Item = IpAddr>,
    ) -> (Vec<IpAddr>, Option<(IpAddr, Refusal)>) {
        let mut refused = None;
        let allowed = ips
            .into_iter()
            .filter(|&ip| match self.check(transport, ip) {
                Ok(()) => true,
                Err(refusal) => {
                    refused.get_or_insert((ip, refusal));
                    false
                }
            })
            .collect();
        (allowed, refused)
    }

    /// Whether a request over `transport` may connect to `ip`: anything in the allowed
    /// networks; otherwise only a public address, over `https://`.
    pub fn check(&self, transport: Transport, ip: IpAddr) -> Result<(), Refusal> {
        if self.allowed.contains(ip) {
            return Ok(());
        }
        match (address_kind(ip), transport) {
            (AddressKind::Public, Transport::Https) => Ok(()),
            (AddressKind::Public, Transport::Http) => Err(Refusal::PlainHttp),
            (kind, _) => Err(Refusal::Address(kind)),
        }
    }
}

/// A URL's host: an address however it is spelled, or a name to resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Address(IpAddr),
    Name(String),
}

/// Reads a URL's host as browsers do (WHATWG): IPv4 in decimal, octal or hex, whole or in
/// parts, with a trailing dot, is the address it spells; `[…]` is IPv6; anything else is a
/// domain name (lower-cased, IDNA). `None` when it is none of these.
pub fn parse_host(host: &str) -> Option<Host> {
    url::Host::parse(host).ok().map(Host::from)
}

impl<S: Into<String>> From<url::Host<S>> for Host {
    fn from(host: url::Host<S>) -> Self {
        match host {
            url::Host::Ipv4(v4) => Host::Address(IpAddr::V4(v4)),
            url::Host::Ipv6(v6) => Host::Address(IpAddr::V6(v6)),
            url::Host::Domain(name) => Host::Name(name.into()),
        }
    }
}

/// An endpoint URL's transport, host and port (the scheme's default when none is given).
pub fn endpoint_target(endpoint: &str) -> Result<(Transport, Host, u16), LimitError> {
    let invalid = || {
        LimitError::new(
            "endpoint",
            "the given URL",
            "an absolute http:// or https:// URL with a host",
        )
    };
    let url = url::Url::parse(endpoint).map_err(|_| invalid())?;
    let transport = match url.scheme() {
        "https" => Transport::Https,
        "http" => Transport::Http,
        _ => return Err(invalid()),
    };
    let host = Host::from(url.host().ok_or_else(invalid)?);
    let port = url.port_or_known_default().ok_or_else(invalid)?;
    Ok((transport, host, port))
}

/// An endpoint URL as logs, error details and `show` may print it: credentials (`user:pass@`)
/// and the query string, where webhook URLs carry their secrets, are replaced with `***`, so
/// it still says that they are there; the fragment (never sent) is dropped.
pub fn redact_endpoint(endpoint: &str) -> String {
    let Ok(url) = url::Url::parse(endpoint) else {
        return "(an endpoint URL that cannot be read)".to_string();
    };
    let credentials = if url.username().is_empty() && url.password().is_none() {
        ""
    } else {
        "***@"
    };
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    let query = if url.query().is_some() { "?***" } else { "" };
    format!(
        "{}://{credentials}{}{port}{}{query}",
        url.scheme(),
        url.host_str().unwrap_or_default(),
        url.path()
    )
}

/// A URL's origin (scheme, host and port: the server that carries its load, whatever the
/// path), without credentials, path or query; `None` for what has no origin of its own (an
/// AWS resource's ARN).
pub fn endpoint_origin(endpoint: &str) -> Option<String> {
    let url = url::Url::parse(endpoint).ok()?;
    let origin = url.origin();
    origin.is_tuple().then(|| origin.ascii_serialization())
}

/// A stable key for an endpoint that does not hold its URL (which may hold credentials): the
/// SHA-256 of the URL, hex. Endpoint health is stored under it.
pub fn endpoint_digest(endpoint: &str) -> String {
    use sha2::Digest;
    crate::validation::hex(&sha2::Sha256::digest(endpoint.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use AddressKind::*;

    fn kind(text: &str) -> AddressKind {
        address_kind(text.parse().unwrap())
    }

    #[test]
    fn ipv4_ranges_are_sorted() {
        for (ip, expected) in [
            ("127.0.0.1", Loopback),
            ("127.255.255.254", Loopback),
            ("10.0.0.1", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.1.1", Private),
            ("169.254.169.254", LinkLocal),
            ("169.254.170.2", LinkLocal),
            ("169.254.170.23", LinkLocal),
            ("100.64.0.1", SharedAddressSpace),
            ("100.127.255.255", SharedAddressSpace),
            ("224.0.0.1", Multicast),
            ("239.255.255.250", Multicast),
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Unspecified),
            ("255.255.255.255", Reserved),
            ("240.0.0.1", Reserved),
            ("192.0.0.8", Reserved),
            ("192.0.2.1", Reserved),
            ("198.51.100.7", Reserved),
            ("203.0.113.9", Reserved),
            ("198.18.0.1", Reserved),
            ("192.88.99.1", Reserved),
            // Just outside each range.
            ("172.32.0.1", Public),
            ("172.15.255.255", Public),
            ("100.128.0.1", Public),
            ("100.63.255.255", Public),
            ("169.253.1.1", Public),
            ("198.20.0.1", Public),
            ("8.8.8.8", Public),
            ("52.95.110.1", Public),
        ] {
            assert_eq!(kind(ip), expected, "{ip}");
        }
    }

    #[test]
    fn ipv6_ranges_are_sorted_and_embedded_ipv4_is_looked_through() {
        for (ip, expected) in [
            ("::1", Loopback),
            ("::", Unspecified),
            ("fc00::1", Private),
            ("fd00:ec2::254", Private), // EC2 instance metadata over IPv6
            ("fd00:ec2::23", Private),  // EKS pod identity over IPv6
            ("fec0::1", Private),
            ("fe80::1", LinkLocal),
            ("febf::1", LinkLocal),
            ("ff02::1", Multicast),
            ("2001:db8::1", Reserved),
            ("2001::1", Reserved), // Teredo
            ("3fff::1", Reserved),
            ("100::1", Reserved),
            ("::7f00:1", Reserved), // IPv4-compatible, deprecated
            ("64:ff9b:1::1", Reserved),
            ("4000::1", Reserved),
            // IPv4-mapped, NAT64 and 6to4 forms are the IPv4 address they carry.
            ("::ffff:127.0.0.1", Loopback),
            ("::ffff:7f00:1", Loopback),
            ("::ffff:169.254.169.254", LinkLocal),
            ("::ffff:10.1.2.3", Private),
            ("::ffff:8.8.8.8", Public),
            ("64:ff9b::a9fe:a9fe", LinkLocal),
            ("64:ff9b::808:808", Public),
            ("2002:7f00:1::1", Loopback),
            ("2002:c0a8:101::1", Private),
            ("2002:808:808::1", Public),
            ("2600:1f18::1", Public),
            ("2a00:1450:4001:80b::200e", Public),
        ] {
            assert_eq!(kind(ip), expected, "{ip}");
        }
    }

    #[test]
    fn every_spelling_of_an_address_is_that_address() {
        let loopback = Some(Host::Address("127.0.0.1".parse().unwrap()));
        for spelling in [
            "127.0.0.1",
            "127.0.0.1.",
            "2130706433",
            "0x7f000001",
            "0x7f.1",
            "0177.0.0.1",
            "0177.1",
            "127.1",
            "127.0.1",
            "0x7F.0.0.0x1",
        ] {
            assert_eq!(parse_host(spelling), loopback, "{spelling}");
        }
        assert_eq!(
            parse_host("[::ffff:169.254.169.254]"),
            Some(Host::Address("::ffff:a9fe:a9fe".parse().unwrap()))
        );
        assert_eq!(
            parse_host("LocalHost."),
            Some(Host::Name("localhost.".into()))
        );
        assert_eq!(
            parse_host("hooks.example.com"),
            Some(Host::Name("hooks.example.com".into()))
        );
        // A number too large for IPv4 is not a name either.
        assert_eq!(parse_host("4294967296"), None);
    }

    #[test]
    fn endpoint_targets_are_read_from_urls_in_any_spelling() {
        let (t, host, port) = endpoint_target("http://0x7f.1:8080/hook").unwrap();
        assert_eq!(t, Transport::Http);
        assert_eq!(host, Host::Address("127.0.0.1".parse().unwrap()));
        assert_eq!(port, 8080);
        let (t, host, port) = endpoint_target("https://user:pw@[::ffff:a9fe:a9fe]/x").unwrap();
        assert_eq!((t, port), (Transport::Https, 443));
        assert_eq!(
            address_kind(match host {
                Host::Address(ip) => ip,
                Host::Name(_) => panic!("an address"),
            }),
            LinkLocal
        );
        assert!(endpoint_target("ftp://example.com/").is_err());
    }

    #[test]
    fn the_policy_refuses_what_is_not_public_unless_allowed() {
        let strict = OutboundPolicy::default();
        let public: IpAddr = "52.95.110.1".parse().unwrap();
        assert_eq!(strict.check(Transport::Https, public), Ok(()));
        assert_eq!(
            strict.check(Transport::Http, public),
            Err(Refusal::PlainHttp)
        );
        for (ip, k) in [
            ("127.0.0.1", Loopback),
            ("::ffff:127.0.0.1", Loopback),
            ("169.254.169.254", LinkLocal),
            ("10.0.0.1", Private),
        ] {
            assert_eq!(
                strict.check(Transport::Https, ip.parse().unwrap()),
                Err(Refusal::Address(k)),
                "{ip}"
            );
        }

        let local = OutboundPolicy::new(AllowedNetworks::loopback());
        for ip in ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"] {
            assert_eq!(
                local.check(Transport::Http, ip.parse().unwrap()),
                Ok(()),
                "{ip}"
            );
        }
        assert_eq!(
            local.check(Transport::Https, "10.0.0.1".parse().unwrap()),
            Err(Refusal::Address(Private))
        );
        // An allowed public network may be reached over plain http.
        let office = OutboundPolicy::new("203.0.113.0/24,52.95.110.1".parse().unwrap());
        assert_eq!(office.check(Transport::Http, public), Ok(()));
        assert_eq!(
            office.check(Transport::Http, "203.0.113.40".parse().unwrap()),
            Ok(())
        );
        // Sorting a name's addresses: the allowed ones in order, and the first refused.
        let ips: Vec<IpAddr> = ["10.0.0.1", "52.95.110.1", "127.0.0.1", "8.8.8.8"]
            .iter()
            .map(|ip| ip.parse().unwrap())
            .collect();
        let (allowed, refused) = strict.sort(Transport::Https, ips.clone());
        assert_eq!(allowed, vec![ips[1], ips[3]]);
        assert_eq!(refused, Some((ips[0], Refusal::Address(Private))));
        assert_eq!(local.sort(Transport::Http, [ips[2]]), (vec![ips[2]], None));
    }

    #[test]
    fn endpoints_are_printed_without_credentials_or_query() {
        for (endpoint, shown) in [
            (
                "https://user:pa%40ss@hooks.example.com:8443/in?code=s3cret#frag",
                "https://***@hooks.example.com:8443/in?***",
            ),
            (
                "https://hooks.example.com/in?sig=abc",
                "https://hooks.example.com/in?***",
            ),
            (
                "https://token@hooks.example.com/",
                "https://***@hooks.example.com/",
            ),
            ("http://[::1]:9/hook", "http://[::1]:9/hook"),
            (
                "https://hooks.example.com/in",
                "https://hooks.example.com/in",
            ),
            ("not a url s3cret", "(an endpoint URL that cannot be read)"),
        ] {
            let redacted = redact_endpoint(endpoint);
            assert_eq!(redacted, shown);
            assert!(
                !redacted.contains("s3cret") && !redacted.contains("pa%40ss"),
                "{redacted}"
            );
        }
        let digest = endpoint_digest("https://u:s3cret@hooks.example.com/?code=s3cret");
        assert_eq!(digest.len(), 64);
        assert_ne!(digest, endpoint_digest("https://hooks.example.com/"));
    }

    #[test]
    fn allowed_networks_are_parsed_with_errors_that_name_the_value() {
        let nets: AllowedNetworks = " 10.0.0.0/8 , fd00::/8,192.0.2.7 ,".parse().unwrap();
        assert_eq!(nets.to_string(), "10.0.0.0/8,fd00::/8,192.0.2.7/32");
        assert!(nets.contains("10.9.9.9".parse().unwrap()));
        assert!(nets.contains("::ffff:10.9.9.9".parse().unwrap()));
        assert!(!nets.contains("192.0.2.8".parse().unwrap()));
        // Host bits are dropped, as AWS does with CIDRs.
        let nets: AllowedNetworks = "10.1.2.3/8".parse().unwrap();
        assert_eq!(nets.to_string(), "10.0.0.0/8");
        assert!("".parse::<AllowedNetworks>().unwrap().is_empty());
        let e = "10.0.0.0/33".parse::<AllowedNetworks>().unwrap_err();
        assert_eq!(e.field, ALLOWED_NETWORKS_FIELD);
        assert!(e.value.contains("10.0.0.0/33"), "{e:?}");
        assert!(e.allowed.contains("CIDR"), "{e:?}");
        assert!("example.com".parse::<AllowedNetworks>().is_err());
    }
}

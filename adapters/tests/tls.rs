//! https:// endpoints through the outbound connector (issue #10): TLS names and verifies the
//! server by the URL's host, while the connection goes to the address the policy checked.
//! Its own test binary: it points the platform verifier at a test CA with `SSL_CERT_FILE`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use gridrelay_adapters::http_sender::{HttpEventSender, SenderConfig};
use gridrelay_ports::memory::MemoryResolver;
use gridrelay_shared::classify::AttemptResult;
use gridrelay_shared::outbound::OutboundPolicy;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use support::deliver_empty;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// A listener that completes a TLS handshake on each accepted connection.
struct TlsListener {
    tcp: TcpListener,
    tls: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            if let Ok((stream, addr)) = self.tcp.accept().await
                && let Ok(tls) = self.tls.accept(stream).await
            {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// An https subscriber on 127.0.0.2 with a certificate for `name` from a fresh CA, whose PEM
/// is written to `ca_file`; returns the port.
async fn https_subscriber(name: &str, ca_file: &std::path::Path) -> u16 {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    std::fs::write(ca_file, ca.pem()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let config = tokio_rustls::rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    let tcp = TcpListener::bind("127.0.0.2:0").await.unwrap();
    let port = tcp.local_addr().unwrap().port();
    let listener = TlsListener {
        tcp,
        tls: TlsAcceptor::from(Arc::new(config)),
    };
    let app = Router::new().route("/hook", post(|| async { "ok" }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// A name resolved by the sender's resolver to an allowed address is delivered to over TLS,
/// the certificate verified for the name (not the address); a name the certificate does not
/// cover, resolved to the same address, is not.
#[tokio::test]
async fn https_is_verified_by_the_urls_name_on_the_checked_address() {
    let ca_file =
        std::env::temp_dir().join(format!("gridrelay-test-ca-{}.pem", std::process::id()));
    let port = https_subscriber("hooks.tls.test", &ca_file).await;
    // SAFETY: set before any thread of this test binary reads the environment (one test).
    unsafe { std::env::set_var("SSL_CERT_FILE", &ca_file) };
    let resolver = Arc::new(MemoryResolver::default());
    resolver.set("hooks.tls.test", &["127.0.0.2"]);
    resolver.set("other.tls.test", &["127.0.0.2"]);
    let sender = HttpEventSender::new(SenderConfig {
        resolver,
        ..SenderConfig::new(
            Duration::from_secs(5),
            8,
            OutboundPolicy::new("127.0.0.2/32".parse().unwrap()),
        )
    })
    .unwrap();

    let good = deliver_empty(&sender, &format!("https://hooks.tls.test:{port}/hook")).await;
    assert_eq!(good, AttemptResult::Status(200));
    let wrong_name = deliver_empty(&sender, &format!("https://other.tls.test:{port}/hook")).await;
    assert!(
        matches!(&wrong_name, AttemptResult::ConnectionFailed(e)
            if e.starts_with("TLS error: ") && e.contains("certificate")),
        "{wrong_name:?}"
    );
    let _ = std::fs::remove_file(&ca_file);
}

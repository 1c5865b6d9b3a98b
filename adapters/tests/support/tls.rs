//! https subscribers with certificates from a test CA, for the TLS and HTTP/2 tests. Each test
//! binary that uses it points the platform verifier at the CA with `SSL_CERT_FILE`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::Version;
use axum::routing::post;
use gridrelay_adapters::http_sender::{HttpEventSender, SenderConfig};
use gridrelay_ports::memory::MemoryResolver;
use gridrelay_shared::outbound::OutboundPolicy;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
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

/// A fresh certificate authority whose PEM is in a file of its own (removed on drop).
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub file: PathBuf,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let file = std::env::temp_dir().join(format!(
            "gridrelay-test-ca-{name}-{}.pem",
            std::process::id()
        ));
        std::fs::write(&file, issuer.pem()).unwrap();
        Self { issuer, file }
    }

    /// An https subscriber on 127.0.0.2 with a certificate for `name`, offering the protocols
    /// in `alpn` (none: the client's default, HTTP/1.1); returns its port and the HTTP version
    /// of each request it has answered.
    pub async fn https_subscriber(
        &self,
        name: &str,
        alpn: &[&[u8]],
    ) -> (u16, Arc<Mutex<Vec<Version>>>) {
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &self.issuer)
            .unwrap();
        let mut config = tokio_rustls::rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let tcp = TcpListener::bind("127.0.0.2:0").await.unwrap();
        let port = tcp.local_addr().unwrap().port();
        let listener = TlsListener {
            tcp,
            tls: TlsAcceptor::from(Arc::new(config)),
        };
        let versions = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&versions);
        let app = Router::new().route(
            "/hook",
            post(move |request: Request| async move {
                seen.lock().unwrap().push(request.version());
                "ok"
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        (port, versions)
    }
}

/// A sender that may reach 127.0.0.2 only (where the subscribers listen), resolving each of
/// `names` to it.
pub fn sender_resolving(names: &[&str]) -> HttpEventSender {
    let resolver = Arc::new(MemoryResolver::default());
    for name in names {
        resolver.set(name, &["127.0.0.2"]);
    }
    HttpEventSender::new(SenderConfig {
        resolver,
        ..SenderConfig::new(
            Duration::from_secs(5),
            8,
            OutboundPolicy::new("127.0.0.2/32".parse().unwrap()),
        )
    })
    .unwrap()
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

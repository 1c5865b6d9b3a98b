//! https:// endpoints through the outbound connector (issue #10): TLS names and verifies the
//! server by the URL's host, while the connection goes to the address the policy checked.
//! Its own test binary: it points the platform verifier at a test CA with `SSL_CERT_FILE`.

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod support;

use gridrelay_shared::classify::AttemptResult;
use support::deliver_empty;
use support::tls::{TestCa, sender_resolving};

/// A name resolved by the sender's resolver to an allowed address is delivered to over TLS,
/// the certificate verified for the name (not the address); a name the certificate does not
/// cover, resolved to the same address, is not.
#[tokio::test]
async fn https_is_verified_by_the_urls_name_on_the_checked_address() {
    let ca = TestCa::new("tls");
    let (port, _) = ca.https_subscriber("hooks.tls.test", &[]).await;
    // SAFETY: set before any thread of this test binary reads the environment (one test).
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("SSL_CERT_FILE", &ca.file)
    };
    let sender = sender_resolving(&["hooks.tls.test", "other.tls.test"]);

    let good = deliver_empty(&sender, &format!("https://hooks.tls.test:{port}/hook")).await;
    assert_eq!(good, AttemptResult::Status(200));
    let wrong_name = deliver_empty(&sender, &format!("https://other.tls.test:{port}/hook")).await;
    assert!(
        matches!(&wrong_name, AttemptResult::ConnectionFailed(e)
            if e.starts_with("TLS error: ") && e.contains("certificate")),
        "{wrong_name:?}"
    );
}

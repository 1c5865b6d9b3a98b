//! A1: access tokens for webhook endpoints protected by OAuth 2.0 client credentials. The
//! rules (the request, what an answer means, how long a token is kept) are
//! `gridrelay_shared::oauth`'s; this is the I/O: the client secret from the secret store, the
//! token endpoint behind a small trait, and the tokens a warm function keeps.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use gridrelay_shared::oauth::{
    AccessToken, ClientCredentials, TokenFailure, basic_authorization, parse_token_response,
    token_request_body,
};

use crate::{Clock, EventSender, SecretStore};

/// Where token requests go: an HTTP POST under the same outbound rules as deliveries
/// (allowed networks, `https://` outside them), with the attempt timeout. Every
/// [`EventSender`] is one ([`EventSender::request_token`]).
#[async_trait]
pub trait TokenEndpoint: Send + Sync {
    /// POSTs `body` (form-encoded) to `url` with `authorization`; the answer's status and
    /// body, or why none came (never naming the URL's credentials or query).
    async fn request(
        &self,
        url: &str,
        authorization: &str,
        body: &str,
    ) -> Result<(u16, Vec<u8>), String>;
}

#[async_trait]
impl<T: EventSender + ?Sized> TokenEndpoint for T {
    async fn request(
        &self,
        url: &str,
        authorization: &str,
        body: &str,
    ) -> Result<(u16, Vec<u8>), String> {
        self.request_token(url, authorization, body).await
    }
}

/// Kept tokens above this many are pruned of those no longer fresh.
const PRUNE_ABOVE: usize = 1024;

/// One credentials' token, and what the last request for it got.
#[derive(Default)]
struct Slot {
    /// Requests for it that have ended (read before waiting for the lock: a delivery that
    /// waited behind a request takes that request's answer).
    ended: AtomicUsize,
    state: futures::lock::Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    token: Option<AccessToken>,
    /// The last request's failure, for those that waited behind it.
    failure: Option<TokenFailure>,
}

/// What [`TokenCache::token`] got, and whether it asked the token endpoint itself (then its
/// answer is news to record: the subscription's token record, `show`'s
/// `deliveryStatus.token`), or took a kept token or the failure of a request it waited behind.
#[derive(Debug)]
pub struct TokenAnswer {
    pub token: Result<AccessToken, TokenFailure>,
    pub fetched: bool,
}

/// The tokens one function instance keeps, one per subscription and credentials
/// ([`ClientCredentials::cache_key`]). However many deliveries ask at once, one request goes
/// to the token endpoint, and the others take its answer, a token or a failure. A failure is
/// not kept beyond that: the next delivery asks again.
#[derive(Default)]
pub struct TokenCache {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    fetches: AtomicUsize,
}

impl TokenCache {
    /// Requests made to token endpoints so far.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    fn slot(&self, key: String, now: chrono::DateTime<chrono::Utc>) -> Arc<Slot> {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if slots.len() > PRUNE_ABOVE {
            // Credentials changed or subscriptions gone: their slots hold stale tokens (or
            // none). One that is being fetched right now is locked, and kept.
            slots.retain(|_, slot| match slot.state.try_lock() {
                Some(held) => held.token.as_ref().is_some_and(|t| t.is_fresh(now)),
                None => true,
            });
        }
        Arc::clone(slots.entry(key).or_default())
    }

    /// A token for `credentials` of `subscription_id`: the one kept, while it is fresh and is
    /// not `rejected` (a token the endpoint answered 401 to); the failure of a request this
    /// call waited behind; otherwise one fetched now.
    pub async fn token<E: TokenEndpoint + ?Sized>(
        &self,
        subscription_id: &str,
        credentials: &ClientCredentials,
        rejected: Option<&AccessToken>,
        secrets: &dyn SecretStore,
        endpoint: &E,
        clock: &dyn Clock,
    ) -> TokenAnswer {
        let answer = |token, fetched| TokenAnswer { token, fetched };
        let slot = self.slot(credentials.cache_key(subscription_id), clock.now());
        let ended_before = slot.ended.load(Ordering::SeqCst);
        let mut held = slot.state.lock().await;
        if let Some(token) = held.token.as_ref()
            && token.is_fresh(clock.now())
            && Some(token) != rejected
        {
            return answer(Ok(token.clone()), false);
        }
        if slot.ended.load(Ordering::SeqCst) != ended_before
            && let Some(failure) = &held.failure
        {
            return answer(Err(failure.clone()), false);
        }
        let fetched = self.fetch(credentials, secrets, endpoint, clock).await;
        held.token = fetched.as_ref().ok().cloned();
        held.failure = fetched.as_ref().err().cloned();
        slot.ended.fetch_add(1, Ordering::SeqCst);
        answer(fetched, true)
    }

    /// A1: an endpoint answered 401 to `rejected`, and no new token is fetched now (the
    /// invocation has no time left to send again): it is not kept, so the next delivery
    /// fetches another instead of sending it again.
    pub async fn forget(
        &self,
        subscription_id: &str,
        credentials: &ClientCredentials,
        rejected: &AccessToken,
    ) {
        let key = credentials.cache_key(subscription_id);
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key)
            .cloned();
        if let Some(slot) = slot {
            let mut held = slot.state.lock().await;
            if held.token.as_ref() == Some(rejected) {
                held.token = None;
            }
        }
    }

    /// One request to the token endpoint, with the client secret read now.
    async fn fetch<E: TokenEndpoint + ?Sized>(
        &self,
        credentials: &ClientCredentials,
        secrets: &dyn SecretStore,
        endpoint: &E,
        clock: &dyn Clock,
    ) -> Result<AccessToken, TokenFailure> {
        let secret = secrets
            .get(&credentials.client_secret_id)
            .await
            .map_err(|e| TokenFailure::SecretUnavailable(e.to_string()))?;
        let authorization = basic_authorization(&credentials.client_id, secret.expose());
        self.fetches.fetch_add(1, Ordering::SeqCst);
        let (status, answer) = endpoint
            .request(
                &credentials.token_url,
                &authorization,
                &token_request_body(credentials),
            )
            .await
            .map_err(TokenFailure::Unreachable)?;
        parse_token_response(status, &answer, clock.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{ManualClock, MemorySecretStore};
    use chrono::{DateTime, Utc};
    use std::sync::atomic::AtomicU16;

    /// A token endpoint that counts its requests, answers `status` with a fresh token each
    /// time (`t1`, `t2`, ...) and yields once first, so that requests overlap.
    #[derive(Default)]
    struct CountingEndpoint {
        requests: AtomicUsize,
        status: AtomicU16,
        seen: Mutex<Vec<(String, String)>>,
    }

    #[async_trait]
    impl TokenEndpoint for CountingEndpoint {
        async fn request(
            &self,
            _url: &str,
            authorization: &str,
            body: &str,
        ) -> Result<(u16, Vec<u8>), String> {
            let n = self.requests.fetch_add(1, Ordering::SeqCst) + 1;
            // So that other deliveries ask meanwhile.
            crate::memory::yield_once().await;
            self.seen
                .lock()
                .unwrap()
                .push((authorization.to_string(), body.to_string()));
            let status = match self.status.load(Ordering::SeqCst) {
                0 => 200,
                s => s,
            };
            let body =
                format!(r#"{{"access_token":"t{n}","token_type":"Bearer","expires_in":600}}"#);
            Ok((status, body.into_bytes()))
        }
    }

    fn credentials(secret_id: &str) -> ClientCredentials {
        ClientCredentials {
            token_url: "https://login.example.com/token".into(),
            client_id: "client".into(),
            client_secret_id: secret_id.into(),
            scope: Some("events".into()),
            audience: None,
        }
    }

    fn start() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
    }

    struct Setup {
        cache: TokenCache,
        endpoint: CountingEndpoint,
        secrets: MemorySecretStore,
        clock: ManualClock,
        credentials: ClientCredentials,
    }

    fn setup() -> Setup {
        let secrets = MemorySecretStore::default();
        let id = futures::executor::block_on(secrets.put("s", "p@ss")).unwrap();
        Setup {
            cache: TokenCache::default(),
            endpoint: CountingEndpoint::default(),
            secrets,
            clock: ManualClock::new(start()),
            credentials: credentials(&id),
        }
    }

    impl Setup {
        async fn token(&self, rejected: Option<&AccessToken>) -> Result<AccessToken, TokenFailure> {
            self.answer(rejected).await.token
        }

        async fn answer(&self, rejected: Option<&AccessToken>) -> TokenAnswer {
            self.cache
                .token(
                    "sub-1",
                    &self.credentials,
                    rejected,
                    &self.secrets,
                    &self.endpoint,
                    &self.clock,
                )
                .await
        }
    }

    /// A1: many deliveries asking at once make one token request, with the secret in Basic
    /// authorization; later ones get the same token while it is fresh.
    #[test]
    fn deliveries_at_once_share_one_token_request_a1() {
        let s = setup();
        let answers =
            futures::executor::block_on(futures::future::join_all((0..20).map(|_| s.answer(None))));
        assert!(
            answers
                .iter()
                .all(|a| a.token.as_ref().unwrap().authorization() == "Bearer t1")
        );
        // The one that asked says so (it records what it got); the others took its token.
        assert_eq!(answers.iter().filter(|a| a.fetched).count(), 1);
        assert_eq!(
            (
                s.endpoint.requests.load(Ordering::SeqCst),
                s.cache.fetches()
            ),
            (1, 1)
        );
        let seen = s.endpoint.seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            vec![(
                basic_authorization("client", "p@ss"),
                "grant_type=client_credentials&scope=events".to_string()
            )]
        );
        s.clock.advance(std::time::Duration::from_secs(539));
        let again = futures::executor::block_on(s.token(None)).unwrap();
        assert_eq!(again.authorization(), "Bearer t1");
        assert_eq!(s.cache.fetches(), 1);
    }

    /// A1: a token is fetched again shortly before it expires (600 s less a minute), and
    /// once when the endpoint rejected it; a rejected token already replaced by another
    /// delivery is not fetched a third time.
    #[test]
    fn a_token_is_fetched_again_when_stale_or_rejected_a1() {
        let s = setup();
        let first = futures::executor::block_on(s.token(None)).unwrap();
        s.clock.advance(std::time::Duration::from_secs(540));
        let second = futures::executor::block_on(s.token(None)).unwrap();
        assert_eq!(second.authorization(), "Bearer t2");
        let third = futures::executor::block_on(s.token(Some(&second))).unwrap();
        assert_eq!(third.authorization(), "Bearer t3");
        // Another delivery's 401 on the second token: the third is already kept.
        let kept = futures::executor::block_on(s.token(Some(&second))).unwrap();
        assert_eq!(kept, third);
        assert_ne!(first, third);
        assert_eq!(s.cache.fetches(), 3);
    }

    /// A1: deliveries that waited behind a failed request take its failure and do not ask
    /// again one after another (a token endpoint that hangs would hold each for its
    /// timeout); a delivery that asks after it does ask again.
    #[test]
    fn deliveries_waiting_behind_a_failed_request_share_its_failure_a1() {
        let s = setup();
        s.endpoint.status.store(503, Ordering::SeqCst);
        let answers =
            futures::executor::block_on(futures::future::join_all((0..10).map(|_| s.answer(None))));
        assert!(answers.iter().all(|a| a.token
            == Err(TokenFailure::Refused {
                status: 503,
                error: None
            })));
        assert_eq!(s.cache.fetches(), 1);
        // One failure to record, not ten.
        assert_eq!(answers.iter().filter(|a| a.fetched).count(), 1);
        s.endpoint.status.store(200, Ordering::SeqCst);
        assert!(futures::executor::block_on(s.token(None)).is_ok());
        assert_eq!(s.cache.fetches(), 2);
    }

    /// A1: a token forgotten after a 401 is not sent again; another is fetched.
    #[test]
    fn a_forgotten_token_is_fetched_again_a1() {
        let s = setup();
        let first = futures::executor::block_on(s.token(None)).unwrap();
        futures::executor::block_on(s.cache.forget("sub-1", &s.credentials, &first));
        let second = futures::executor::block_on(s.token(None)).unwrap();
        assert_ne!(first, second);
        assert_eq!(s.cache.fetches(), 2);
    }

    /// A1: a refusal is not kept (the next delivery asks again), and an unreadable secret
    /// makes no request.
    #[test]
    fn a_failed_token_request_is_not_kept_a1() {
        let s = setup();
        s.endpoint.status.store(401, Ordering::SeqCst);
        let e = futures::executor::block_on(s.token(None)).unwrap_err();
        assert_eq!(
            e,
            TokenFailure::Refused {
                status: 401,
                error: None
            }
        );
        s.endpoint.status.store(200, Ordering::SeqCst);
        assert!(futures::executor::block_on(s.token(None)).is_ok());
        assert_eq!(s.cache.fetches(), 2);

        let s = setup();
        let missing = Setup {
            credentials: credentials("no-such-secret"),
            ..s
        };
        let e = futures::executor::block_on(missing.token(None)).unwrap_err();
        assert!(matches!(e, TokenFailure::SecretUnavailable(_)), "{e:?}");
        assert_eq!(missing.endpoint.requests.load(Ordering::SeqCst), 0);
    }
}

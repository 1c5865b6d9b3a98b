//! What every console form that changes a subscription opens with (#36): its path's
//! subscription and its fields read, let in only with the run's token
//! ([`super::without_token`]) and for a subscription that exists ([`super::existing`]). A
//! refusal is the extractor's rejection, so a handler starts from what it acts on.

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Path, RawForm, Request};
use axum::response::{IntoResponse, Response};
use gridrelay_shared::subscription::Subscription;

use super::Console;

/// A form's fields, as its POST sends them (a field may come more than once).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Form(Vec<(String, String)>);

impl Form {
    pub(super) fn parse(body: &[u8]) -> Self {
        Self(
            url::form_urlencoded::parse(body)
                .map(|(field, value)| (field.into_owned(), value.into_owned()))
                .collect(),
        )
    }

    /// The first value of `field`.
    pub(super) fn value(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(f, _)| f == field)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `field`, in order.
    pub(super) fn values<'a>(&'a self, field: &'a str) -> impl Iterator<Item = &'a str> {
        self.0
            .iter()
            .filter(move |(f, _)| f == field)
            .map(|(_, v)| v.as_str())
    }

    /// Whether it says `field=yes`: a change asked first, now confirmed, or a box ticked.
    pub(super) fn says_yes(&self, field: &str) -> bool {
        self.value(field) == Some("yes")
    }
}

/// A change let in: its form, and the subscription its path names.
pub(super) struct Change {
    pub(super) form: Form,
    pub(super) sub: Subscription,
}

impl FromRequest<Arc<Console>> for Change {
    type Rejection = Response;

    async fn from_request(request: Request, console: &Arc<Console>) -> Result<Self, Response> {
        let (mut parts, body) = request.into_parts();
        let Path((topic, name)) = Path::<(String, String)>::from_request_parts(&mut parts, console)
            .await
            .map_err(IntoResponse::into_response)?;
        let RawForm(body) = RawForm::from_request(Request::from_parts(parts, body), console)
            .await
            .map_err(IntoResponse::into_response)?;
        let form = Form::parse(&body);
        if let Some(refused) = super::without_token(console, form.value("token")) {
            return Err(refused);
        }
        let sub = super::existing(console, &topic, &name).await?;
        Ok(Self { form, sub })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forms_fields_are_read_by_name_each_time_they_come() {
        let form = Form::parse(b"token=t&pick=a+1&pick=b%2F2&confirm=yes&empty=");
        assert_eq!(form.value("token"), Some("t"));
        assert_eq!(form.values("pick").collect::<Vec<_>>(), ["a 1", "b/2"]);
        assert_eq!(form.value("empty"), Some(""));
        assert_eq!(form.value("missing"), None);
        assert!(form.says_yes("confirm") && !form.says_yes("token"));
    }
}

//! The HTTP client of HTTP-origin mounts: object_store's own, with the response headers it
//! reads more strictly than HTTP defines them put in the form it reads.
//!
//! object_store parses `Last-Modified` as an RFC 2822 date, and fails the whole request on
//! any other form. RFC 9110 (section 5.6.7) has recipients accept three: the IMF-fixdate most
//! servers send, and the obsolete RFC 850 and asctime forms that older ones still do. A date in
//! either old form is rewritten as an IMF-fixdate; one that is no HTTP date at all is dropped,
//! so that the object reads as having no modification time (as an origin that sends none).

use async_trait::async_trait;
use axum::http::header::LAST_MODIFIED;
use axum::http::{HeaderMap, HeaderValue};
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};

/// Connects HTTP-origin mounts through [`Origin`].
#[derive(Debug, Default)]
pub struct OriginConnector;

impl HttpConnector for OriginConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(Origin(ReqwestConnector::default().connect(options)?)))
    }
}

/// object_store's HTTP client, its responses' headers normalized ([`normalize`]).
#[derive(Debug)]
struct Origin(HttpClient);

#[async_trait]
impl HttpService for Origin {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let mut response = self.0.execute(req).await?;
        normalize(response.headers_mut());
        Ok(response)
    }
}

/// `Last-Modified` as an IMF-fixdate, or none when it is no HTTP date.
fn normalize(headers: &mut HeaderMap) {
    let Some(value) = headers.get(LAST_MODIFIED) else {
        return;
    };
    let parsed = value
        .to_str()
        .ok()
        .and_then(|v| httpdate::parse_http_date(v.trim()).ok());
    match parsed.and_then(|t| HeaderValue::from_str(&httpdate::fmt_http_date(t)).ok()) {
        Some(fixed) => {
            headers.insert(LAST_MODIFIED, fixed);
        }
        None => {
            headers.remove(LAST_MODIFIED);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_http_date_form_becomes_an_imf_fixdate_and_others_go() {
        for (sent, want) in [
            ("Sun, 06 Nov 1994 08:49:37 GMT", Some("Sun, 06 Nov 1994 08:49:37 GMT")),
            ("Sunday, 06-Nov-94 08:49:37 GMT", Some("Sun, 06 Nov 1994 08:49:37 GMT")),
            ("Sun Nov  6 08:49:37 1994", Some("Sun, 06 Nov 1994 08:49:37 GMT")),
            ("yesterday", None),
            ("", None),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(LAST_MODIFIED, HeaderValue::from_static(sent));
            normalize(&mut headers);
            assert_eq!(headers.get(LAST_MODIFIED).map(|v| v.to_str().unwrap()), want, "{sent}");
        }
        let mut none = HeaderMap::new();
        normalize(&mut none);
        assert!(none.is_empty());
    }
}

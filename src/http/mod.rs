//! Route handlers, one file per route family, and the compression of their answers of text
//! ([`compress`]).

pub mod api;
pub mod compress;
pub mod raw;
pub mod slice;
pub mod zom;

/// A route's query parameters: the value of each of `names`, in their order, decoded as forms
/// send them (`+` for a space, percent escapes; `application/x-www-form-urlencoded`). A name
/// given twice is 400, and so is an unknown one, so that a misspelt one is not ignored, but for
/// `_` (the cache buster JavaScript clients add, as often as they like), which every route
/// ignores. Values borrow from the URI where they have nothing to decode.
pub(crate) fn query<'a, const N: usize>(
    uri: &'a axum::http::Uri,
    names: [&str; N],
) -> Result<[Option<std::borrow::Cow<'a, str>>; N], crate::error::ApiError> {
    let bad = |what: String| crate::error::ApiError::BadRequest(format!("bad query: {what}"));
    let mut values = [const { None }; N];
    let mut take = |name: std::borrow::Cow<'a, str>, value| {
        if name == "_" {
            return Ok(());
        }
        let Some(i) = names.iter().position(|n| *n == name) else {
            let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            let expected = match quoted.as_slice() {
                [] => "there are no fields".to_string(),
                [one] => format!("expected {one}"),
                [a, b] => format!("expected {a} or {b}"),
                all => format!("expected one of {}", all.join(", ")),
            };
            return Err(bad(format!("unknown field `{name}`, {expected}")));
        };
        if values[i].replace(value).is_some() {
            return Err(bad(format!("duplicate field `{}`", names[i])));
        }
        Ok(())
    };
    let text = uri.query().unwrap_or("");
    if text.bytes().any(|b| b == b'%' || b == b'+') {
        for (name, value) in form_urlencoded::parse(text.as_bytes()) {
            take(name, value)?;
        }
    } else {
        for (name, value) in plain_pairs(text) {
            take(name.into(), value.into())?;
        }
    }
    Ok(values)
}

/// The pairs `form_urlencoded::parse` gives of a query with nothing to decode (no `%`, no `+`),
/// cut from its text: the usual query, at a fraction of the work. Its separators are ASCII, so
/// it is cut at byte positions: splitting on a `char` sets up a `memchr` for each piece, and on
/// a predicate decodes every character, more work than the pieces' few bytes.
fn plain_pairs(text: &str) -> impl Iterator<Item = (&str, &str)> {
    let at = |piece: &str, sep: u8| piece.bytes().position(|b| b == sep);
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        loop {
            let piece = rest?;
            let pair = match at(piece, b'&') {
                Some(i) => {
                    rest = Some(&piece[i + 1..]);
                    &piece[..i]
                }
                None => {
                    rest = None;
                    piece
                }
            };
            if !pair.is_empty() {
                return Some(match at(pair, b'=') {
                    Some(i) => (&pair[..i], &pair[i + 1..]),
                    None => (pair, ""),
                });
            }
        }
    })
}

/// A response builder whose header map has room for a response's own headers and for those the
/// CORS layer adds to it. A map created empty holds six before it grows, and growing it as the
/// CORS layer extended it was ~5% of a warm tile's CPU at 64 connections.
pub(crate) fn response() -> axum::http::response::Builder {
    let mut builder = axum::http::Response::builder();
    if let Some(headers) = builder.headers_mut() {
        headers.reserve(12);
    }
    builder
}

/// Appends a header to a response being built. `Builder::header` moves the whole builder
/// through a `Result` at each call and converts its arguments: a warm tile's five headers
/// took ~2k instructions that way.
pub(crate) fn append(
    builder: &mut axum::http::response::Builder,
    name: axum::http::HeaderName,
    value: axum::http::HeaderValue,
) {
    if let Some(headers) = builder.headers_mut() {
        headers.append(name, value);
    }
}

/// Runs a request's `work` as a task of its own, aborted when the request is dropped (its
/// timeout, or its client gone). Work that reads without waiting (local documents in the page
/// cache) uses up tokio's cooperative budget as it goes: run in the request's own task, it
/// would leave none for the request timeout's timer, which could then not fire until the work
/// was done.
pub(crate) async fn own_task<T: Send + 'static>(
    work: impl Future<Output = Result<T, crate::error::ApiError>> + Send + 'static,
) -> Result<T, crate::error::ApiError> {
    joined(tokio_util::task::AbortOnDropHandle::new(tokio::spawn(work)).await)?
}

/// The outcome of a task the request waited for. A panic goes on in the request's own task, so
/// that the server's panic layer answers 500 and logs it as it does a handler's.
pub(crate) fn joined<T>(outcome: Result<T, tokio::task::JoinError>) -> Result<T, crate::error::ApiError> {
    match outcome {
        Ok(t) => Ok(t),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(crate::error::ApiError::Internal),
    }
}

/// A list-valued header (`Accept`, `If-Match`, `If-None-Match`) as one list: its field lines
/// joined, as RFC 9110 section 5.3 reads repeated lines (one line as it is). `None` when it is
/// absent.
pub(crate) fn header_list(
    headers: &axum::http::HeaderMap,
    name: axum::http::HeaderName,
) -> Option<std::borrow::Cow<'_, str>> {
    let mut lines = headers.get_all(name).iter().filter_map(|v| v.to_str().ok());
    let first = lines.next()?;
    match lines.next() {
        None => Some(first.into()),
        Some(second) => {
            let mut joined = [first, second].join(",");
            for line in lines {
                joined.push(',');
                joined.push_str(line);
            }
            Some(joined.into())
        }
    }
}

/// The answer to OPTIONS: no content, and the methods a resource takes.
pub fn options(allow: &'static str) -> axum::response::Response {
    axum::response::IntoResponse::into_response((
        axum::http::StatusCode::NO_CONTENT,
        [(axum::http::header::ALLOW, allow)],
    ))
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::{plain_pairs, query};
    use crate::error::ApiError;

    fn uri(q: &str) -> axum::http::Uri {
        format!("/x?{q}").parse().unwrap()
    }

    fn refused(q: &str, names: &[&str]) -> String {
        let u = uri(q);
        let outcome = match names {
            [] => query(&u, []).map(|_| ()),
            [a] => query(&u, [*a]).map(|_| ()),
            [a, b] => query(&u, [*a, *b]).map(|_| ()),
            [a, b, c] => query(&u, [*a, *b, *c]).map(|_| ()),
            _ => unreachable!(),
        };
        match outcome {
            Err(ApiError::BadRequest(m)) => m,
            other => panic!("{q}: {other:?}"),
        }
    }

    /// Values decoded as forms send them; borrowed where there is nothing to decode; absent
    /// names `None`; the cache buster left out however it is written.
    #[test]
    fn values_are_decoded_and_the_cache_buster_ignored() {
        let u = uri("b=x%2Cy+z&_=1&%5F&_&a=0:2&&");
        let [a, b, c] = query(&u, ["a", "b", "c"]).unwrap();
        assert!(matches!(a, Some(Cow::Borrowed("0:2"))), "{a:?}");
        assert_eq!(b.as_deref(), Some("x,y z"));
        assert_eq!(c, None);
        let u = uri("a");
        assert_eq!(query(&u, ["a"]).unwrap(), [Some(Cow::Borrowed(""))]);
        let u: axum::http::Uri = "/x".parse().unwrap();
        assert_eq!(query(&u, ["a"]).unwrap(), [None]);
        assert_eq!(query(&u, []).unwrap(), []);
    }

    /// A query with nothing to decode is cut into the pairs `form_urlencoded` gives of it.
    #[test]
    fn plain_queries_give_the_pairs_form_urlencoded_gives() {
        for q in [
            "",
            "&",
            "&&",
            "a",
            "a=",
            "=",
            "=x",
            "a=1&&b",
            "a==b",
            "a=b=c",
            "_&_=1",
            ";a=1;b",
            "a=1&a=2",
            "select=520:584,520:584&format=bin",
        ] {
            let ours: Vec<(&str, &str)> = plain_pairs(q).collect();
            let theirs: Vec<(String, String)> = form_urlencoded::parse(q.as_bytes()).into_owned().collect();
            let theirs: Vec<(&str, &str)> = theirs.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            assert_eq!(ours, theirs, "{q:?}");
        }
    }

    /// Unknown and repeated names are refused, in serde's words (what the answers said when
    /// serde_urlencoded read the queries).
    #[test]
    fn unknown_and_repeated_names_are_refused() {
        assert_eq!(refused("x=1", &[]), "bad query: unknown field `x`, there are no fields");
        assert_eq!(refused("x=1", &["a"]), "bad query: unknown field `x`, expected `a`");
        assert_eq!(
            refused("a=1&x", &["a", "b"]),
            "bad query: unknown field `x`, expected `a` or `b`"
        );
        assert_eq!(
            refused("%61%62=1", &["a", "b", "c"]),
            "bad query: unknown field `ab`, expected one of `a`, `b`, `c`"
        );
        assert_eq!(refused("=1", &["a"]), "bad query: unknown field ``, expected `a`");
        assert_eq!(refused("b=1&a=2&b", &["a", "b"]), "bad query: duplicate field `b`");
        assert_eq!(refused("a=1&%61=1", &["a"]), "bad query: duplicate field `a`");
    }
}

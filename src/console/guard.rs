//! What stands between a browser and the console: the Host and Origin rules
//! of `/mcp` (DNS rebinding, cross-site forms), the cookies (HttpOnly,
//! SameSite=Strict, Secure and `__Host-` off loopback), and the headers
//! every console response carries (CSP, no framing, no referrer leaks).

use axum::{
    extract::Request,
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};

/// Styles from the binary only, no script at all, forms only to here, no
/// framing: a message body that got past escaping could still do nothing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const SESSION_COOKIE: &str = "phone_console";
const SECURE_SESSION_COOKIE: &str = "__Host-phone_console";
/// The sign-in form's CSRF token, before there is a session (double submit).
const SIGN_IN_COOKIE: &str = "phone_console_signin";
const SECURE_SIGN_IN_COOKIE: &str = "__Host-phone_console_signin";

const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The hosts and origins the console answers, as for `/mcp`.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Host names (optionally host:port) on top of loopback.
    pub allowed_hosts: Vec<String>,
    /// Browser origins (scheme://host[:port], `:*` for any port).
    pub allowed_origins: Vec<String>,
}

/// A host and port, lowercased, brackets off IPv6.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Authority {
    host: String,
    port: Option<u16>,
}

fn authority(raw: &str) -> Option<Authority> {
    let parsed = http::uri::Authority::try_from(raw.trim()).ok()?;
    if parsed.as_str().contains('@') {
        return None;
    }
    Some(Authority {
        host: parsed.host().trim_matches(['[', ']']).to_ascii_lowercase(),
        port: parsed.port_u16(),
    })
}

impl Rules {
    /// The request's Host, when it is one this server answers to.
    fn host(&self, headers: &HeaderMap) -> Result<Authority, &'static str> {
        let raw = headers
            .get(header::HOST)
            .ok_or("the request has no Host header")?
            .to_str()
            .map_err(|_| "the Host header is not plain text")?;
        let host = authority(raw).ok_or("the Host header is malformed")?;
        let allowed = LOOPBACK.iter().any(|l| *l == host.host)
            || self
                .allowed_hosts
                .iter()
                .filter_map(|a| authority(a))
                .any(|a| a.host == host.host && a.port.is_none_or(|p| host.port == Some(p)));
        if allowed {
            Ok(host)
        } else {
            Err("this host name is not one this server answers to (PHONE_ALLOWED_HOSTS)")
        }
    }

    /// A form's Origin must be this very server, as the browser reached it
    /// (`host`: the same name and port; plain http only on loopback), or a
    /// configured origin. Pinned to the port: on loopback, cookies are not
    /// kept apart by port, so a page on another local port must not post
    /// here. Browsers send Origin with every POST; one without is not a
    /// browser's form.
    fn origin_allowed(&self, headers: &HeaderMap, host: &Authority) -> Result<(), &'static str> {
        let raw = headers
            .get(header::ORIGIN)
            .ok_or("the form arrived without an Origin header")?
            .to_str()
            .map_err(|_| "the Origin header is not plain text")?;
        let uri = http::Uri::try_from(raw.trim()).map_err(|_| "the Origin header is malformed")?;
        let (Some(scheme), Some(auth)) = (uri.scheme_str(), uri.authority()) else {
            return Err("the form was sent from an opaque origin");
        };
        let scheme = scheme.to_ascii_lowercase();
        let origin = authority(auth.as_str()).ok_or("the Origin header is malformed")?;
        let default_port = match scheme.as_str() {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        };
        let port = origin.port.or(default_port);
        let loopback = LOOPBACK.iter().any(|l| *l == origin.host);
        let same_origin = origin.host == host.host
            && port == host.port.or(default_port)
            && (scheme == "https" || (scheme == "http" && loopback));
        let configured = self.allowed_origins.iter().any(|allowed| {
            let (base, any_port) = match allowed.strip_suffix(":*") {
                Some(base) => (base, true),
                None => (allowed.as_str(), false),
            };
            let Ok(a) = http::Uri::try_from(base.trim()) else {
                return false;
            };
            let (Some(a_scheme), Some(a_auth)) = (a.scheme_str(), a.authority()) else {
                return false;
            };
            let Some(a_auth) = authority(a_auth.as_str()) else {
                return false;
            };
            a_scheme.eq_ignore_ascii_case(&scheme)
                && a_auth.host == origin.host
                && (any_port
                    || a_auth.port.or(match a_scheme {
                        "http" => Some(80),
                        "https" => Some(443),
                        _ => None,
                    }) == port)
        });
        if same_origin || configured {
            Ok(())
        } else {
            Err("the form was sent from another site")
        }
    }
}

/// Whether this request reached us over https (any public host: the
/// console is only offered there over https), deciding the cookies' form.
pub fn is_secure(headers: &HeaderMap) -> bool {
    let forwarded_https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"));
    let loopback = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(authority)
        .is_some_and(|a| LOOPBACK.iter().any(|l| *l == a.host));
    forwarded_https || !loopback
}

/// Refuses a request for a host this server does not answer to, and a form
/// from another site; adds the console's headers to every answer.
pub async fn check(rules: std::sync::Arc<Rules>, req: Request, next: Next) -> Response {
    let host = match rules.host(req.headers()) {
        Ok(host) => host,
        Err(why) => {
            tracing::warn!(reason = why, "console: refused a request's Host");
            return with_headers(super::pages::problem(
                StatusCode::FORBIDDEN,
                "Wrong host",
                why,
            ));
        }
    };
    if req.method() != Method::GET
        && req.method() != Method::HEAD
        && let Err(why) = rules.origin_allowed(req.headers(), &host)
    {
        tracing::warn!(reason = why, "console: refused a form's Origin");
        return with_headers(super::pages::problem(
            StatusCode::FORBIDDEN,
            "Form refused",
            &format!("{why}. Open the console at this server's own address and try again."),
        ));
    }
    with_headers(next.run(req).await)
}

pub fn with_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Same-origin keeps Origin on our own forms (no-referrer would send
    // `Origin: null`) and never tells another site what page linked it.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// The value of cookie `name` in the request, if it came once and is not
/// empty. Twice is none: on loopback another port's page can plant a
/// second cookie of the name on a narrower path, which the browser sends
/// first, and the person would act in a stranger's session.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut values = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v.trim());
    let value = values.next()?;
    (values.next().is_none() && !value.is_empty()).then_some(value)
}

fn names(secure: bool) -> (&'static str, &'static str) {
    if secure {
        (SECURE_SESSION_COOKIE, SECURE_SIGN_IN_COOKIE)
    } else {
        (SESSION_COOKIE, SIGN_IN_COOKIE)
    }
}

/// The session cookie's value (the one form this request's scheme uses).
pub fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    cookie(headers, names(is_secure(headers)).0)
}

/// The sign-in form's CSRF cookie.
pub fn sign_in_cookie(headers: &HeaderMap) -> Option<&str> {
    cookie(headers, names(is_secure(headers)).1)
}

fn set_cookie(name: &str, value: &str, max_age: i64, secure: bool) -> HeaderValue {
    // `__Host-` cookies must be Secure with Path=/; on loopback (plain
    // http) the cookie stays on the console's paths.
    let (path, secure_attr) = if secure {
        ("/", "; Secure")
    } else {
        ("/console", "")
    };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure_attr}"
    ))
    .expect("cookie values are URL-safe base64")
}

pub fn session_set(headers: &HeaderMap, secret: &str, max_age: i64) -> HeaderValue {
    let secure = is_secure(headers);
    set_cookie(names(secure).0, secret, max_age, secure)
}

pub fn session_clear(headers: &HeaderMap) -> HeaderValue {
    let secure = is_secure(headers);
    set_cookie(names(secure).0, "", 0, secure)
}

pub fn sign_in_set(headers: &HeaderMap, token: &str) -> HeaderValue {
    let secure = is_secure(headers);
    set_cookie(names(secure).1, token, 3600, secure)
}

pub fn sign_in_clear(headers: &HeaderMap) -> HeaderValue {
    let secure = is_secure(headers);
    set_cookie(names(secure).1, "", 0, secure)
}

/// 303 See Other to `to` (after a form: the browser GETs it).
pub fn see_other(to: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to.to_owned())]).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn rules() -> Rules {
        Rules {
            allowed_hosts: vec!["phone.example".into()],
            allowed_origins: vec!["https://ops.example".into()],
        }
    }

    #[test]
    fn hosts_follow_the_mcp_rules() {
        let r = rules();
        assert!(r.host(&headers(&[("host", "localhost:3000")])).is_ok());
        assert!(r.host(&headers(&[("host", "[::1]:3000")])).is_ok());
        assert!(r.host(&headers(&[("host", "phone.example")])).is_ok());
        assert!(r.host(&headers(&[("host", "evil.example")])).is_err());
        assert!(r.host(&headers(&[("host", "phone.example.evil")])).is_err());
        assert!(r.host(&headers(&[])).is_err());
    }

    #[test]
    fn forms_come_from_this_server_only() {
        let r = rules();
        let ok = |host: &str, o: &str| {
            let h = headers(&[("host", host), ("origin", o)]);
            r.origin_allowed(&h, &r.host(&h).unwrap()).is_ok()
        };
        assert!(ok("localhost:3000", "http://localhost:3000"));
        assert!(ok("127.0.0.1:41234", "http://127.0.0.1:41234"));
        assert!(
            !ok("127.0.0.1:3000", "http://127.0.0.1:8081"),
            "another local port"
        );
        assert!(
            !ok("localhost:3000", "http://127.0.0.1:3000"),
            "another name"
        );
        assert!(ok("phone.example", "https://phone.example"));
        assert!(ok("phone.example", "https://phone.example:443"));
        assert!(ok("phone.example:8443", "https://phone.example:8443"));
        assert!(
            !ok("phone.example", "http://phone.example"),
            "plain http to a public host"
        );
        assert!(!ok("phone.example", "https://phone.example:8443"));
        assert!(
            !ok("phone.example", "http://localhost:3000"),
            "loopback page, public host"
        );
        assert!(ok("phone.example", "https://ops.example"));
        assert!(ok("phone.example", "https://ops.example:443"));
        assert!(
            !ok("phone.example", "https://ops.example:8443"),
            "a configured origin has its default port"
        );
        assert!(!ok("phone.example", "https://evil.example"));
        assert!(!ok("phone.example", "null"));
        let h = headers(&[("host", "phone.example")]);
        assert!(r.origin_allowed(&h, &r.host(&h).unwrap()).is_err());
    }

    #[test]
    fn cookies_are_secure_off_loopback() {
        let local = headers(&[("host", "127.0.0.1:3000")]);
        let public = headers(&[("host", "phone.example")]);
        let v = session_set(&local, "abc", 60);
        assert!(
            v.to_str()
                .unwrap()
                .starts_with("phone_console=abc; Path=/console")
        );
        assert!(!v.to_str().unwrap().contains("Secure"));
        let v = session_set(&public, "abc", 60);
        let v = v.to_str().unwrap();
        assert!(v.starts_with("__Host-phone_console=abc; Path=/;"), "{v}");
        assert!(v.contains("HttpOnly") && v.contains("SameSite=Strict") && v.contains("Secure"));
        let both = headers(&[
            ("host", "phone.example"),
            ("cookie", "phone_console=plain; __Host-phone_console=strong"),
        ]);
        assert_eq!(session_cookie(&both), Some("strong"));
    }
}

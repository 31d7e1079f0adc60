//! A browser, reduced, for the console's tests: forms, cookies, Origin.

use std::collections::HashMap;

use reqwest::{StatusCode, header};

use super::{Agent, TestApp};

/// A browser, reduced: its cookie jar, the Origin of this server on every
/// POST, no automatic redirects (the tests look at them).
pub struct Browser {
    pub http: reqwest::Client,
    pub base: String,
    pub cookies: HashMap<String, String>,
    /// Set-Cookie headers of the last answer.
    pub set_cookies: Vec<String>,
}

pub struct Page {
    pub status: StatusCode,
    pub headers: header::HeaderMap,
    pub body: String,
}

impl Page {
    pub fn location(&self) -> &str {
        self.headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    /// The value of the first form field `name` on the page.
    pub fn field(&self, name: &str) -> String {
        let marker = format!("name=\"{name}\" value=\"");
        let start = self
            .body
            .find(&marker)
            .unwrap_or_else(|| panic!("no field {name} in {}", self.body))
            + marker.len();
        let end = start + self.body[start..].find('"').unwrap();
        self.body[start..end].to_owned()
    }
}

impl Browser {
    pub fn new(app: &TestApp) -> Self {
        Self::at(&format!("http://{}", app.addr))
    }

    pub fn at(base: &str) -> Self {
        Self {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            base: base.to_owned(),
            cookies: HashMap::new(),
            set_cookies: Vec::new(),
        }
    }

    pub fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub async fn finish(&mut self, response: reqwest::Response) -> Page {
        let status = response.status();
        let headers = response.headers().clone();
        self.set_cookies = headers
            .get_all(header::SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        for set in &self.set_cookies {
            let pair = set.split(';').next().unwrap();
            let (k, v) = pair.split_once('=').unwrap();
            if v.is_empty() || set.contains("Max-Age=0") {
                self.cookies.remove(k);
            } else {
                self.cookies.insert(k.to_owned(), v.to_owned());
            }
        }
        Page {
            status,
            headers,
            body: response.text().await.unwrap(),
        }
    }

    pub async fn get(&mut self, path: &str) -> Page {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .header(header::COOKIE, self.cookie_header())
            .send()
            .await
            .unwrap();
        self.finish(response).await
    }

    pub async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> Page {
        self.post_from(path, form, Some(&self.base.clone())).await
    }

    pub async fn post_from(
        &mut self,
        path: &str,
        form: &[(&str, &str)],
        origin: Option<&str>,
    ) -> Page {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .header(header::COOKIE, self.cookie_header())
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(
                url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(form)
                    .finish(),
            );
        if let Some(origin) = origin {
            request = request.header(header::ORIGIN, origin);
        }
        let response = request.send().await.unwrap();
        self.finish(response).await
    }

    /// Signs in through the form; returns the answer to the POST.
    pub async fn sign_in(&mut self, name: &str, token: &str) -> Page {
        let form = self.get("/console/sign-in").await;
        assert_eq!(form.status, StatusCode::OK, "{}", form.body);
        let csrf = form.field("csrf");
        self.post(
            "/console/sign-in",
            &[("name", name), ("token", token), ("csrf", &csrf)],
        )
        .await
    }

    pub async fn signed_in(app: &TestApp, agent: &Agent) -> Self {
        let mut browser = Self::new(app);
        let answer = browser.sign_in(&agent.name, &agent.token).await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
        assert_eq!(answer.location(), "/console/inbox");
        browser
    }
}

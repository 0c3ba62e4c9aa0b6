//! The page itself: one HTML file, one script and one style sheet, compiled into the binary
//! (nothing is fetched from elsewhere, so the dashboard works offline and the CSP can say
//! `default-src 'self'`).

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

pub const INDEX_HTML: &str = include_str!("assets/index.html");
pub const APP_JS: &str = include_str!("assets/app.js");
pub const APP_CSS: &str = include_str!("assets/app.css");

fn file(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            // The files change only with the binary; a page reload after an upgrade refetches.
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

pub async fn index() -> Response {
    file(INDEX_HTML, "text/html; charset=utf-8")
}

pub async fn script() -> Response {
    file(APP_JS, "text/javascript; charset=utf-8")
}

pub async fn style() -> Response {
    file(APP_CSS, "text/css; charset=utf-8")
}

/// Bytes of HTML, JavaScript and CSS a first visit loads.
pub fn page_weight() -> usize {
    INDEX_HTML.len() + APP_JS.len() + APP_CSS.len()
}

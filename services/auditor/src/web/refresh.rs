//! Pages that keep themselves current: a marker element naming the period, and one small
//! script, served from this origin (so a `script-src 'self'` policy allows it), that reloads
//! the page on that period unless the operator is using a form on it.

use axum::http::header;
use axum::response::IntoResponse;
use maud::{html, Markup};
use serde::Deserialize;

use super::WebError;

/// Seconds between reloads when a page's `refresh` is not given.
pub const DEFAULT_S: u32 = 30;
/// The shortest period a page accepts (`0` turns refreshing off).
pub const MIN_S: u32 = 2;
/// The longest period a page accepts.
pub const MAX_S: u32 = 3600;

/// `?refresh=` of a page that has nothing else in its query string.
#[derive(Debug, Default, Deserialize)]
pub struct RefreshQuery {
    refresh: Option<String>,
}

impl RefreshQuery {
    /// The period asked for; see [`parse`].
    pub fn seconds(&self) -> Result<u32, WebError> {
        parse(self.refresh.as_deref())
    }
}

/// `refresh` as seconds: absent or empty is [`DEFAULT_S`], `0` is off, else
/// [`MIN_S`]`..=`[`MAX_S`]; anything else is a 400 naming the field.
pub fn parse(v: Option<&str>) -> Result<u32, WebError> {
    let Some(s) = v.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(DEFAULT_S);
    };
    match s.parse::<u32>() {
        Ok(0) => Ok(0),
        Ok(n) if (MIN_S..=MAX_S).contains(&n) => Ok(n),
        _ => Err(WebError::BadRequest(format!(
            "refresh must be 0 (off) or {MIN_S} to {MAX_S} seconds, not {s:?}"
        ))),
    }
}

/// The script every refreshing page loads. It reads the period from `#auto-refresh`, and
/// skips a reload while focus is in a form field or a note has been typed.
const SCRIPT: &str = r#"(function () {
  var el = document.getElementById('auto-refresh');
  var s = el ? parseInt(el.getAttribute('data-seconds'), 10) : 0;
  if (!(s > 0)) { return; }
  setInterval(function () {
    var a = document.activeElement;
    var busy = a && /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(a.tagName);
    var typed = Array.prototype.some.call(
      document.querySelectorAll('input[name=note]'), function (i) { return i.value !== ''; });
    if (!busy && !typed && document.visibilityState !== 'hidden') { location.reload(); }
  }, s * 1000);
})();
"#;

/// Where [`script`] is served.
pub const SCRIPT_PATH: &str = "/static/refresh.js";

/// `GET /static/refresh.js`
pub async fn script() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        SCRIPT,
    )
}

/// The marker and the script tag for a page refreshing every `seconds` (0: a note saying it
/// does not, with `on` linking to the refreshing version); `off` links to the version that
/// does not refresh.
pub fn marker(seconds: u32, off: &str, on: &str) -> Markup {
    if seconds == 0 {
        return html! {
            p id="auto-refresh" data-seconds="0" class="muted" {
                "Not refreshing · " a href=(on) { "refresh automatically" }
            }
        };
    }
    html! {
        p id="auto-refresh" data-seconds=(seconds) class="muted" {
            "Refreshes every " (seconds) " s · " a href=(off) { "stop" }
        }
        script src=(SCRIPT_PATH) defer {}
    }
}

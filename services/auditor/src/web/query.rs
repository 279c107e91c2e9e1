//! The incident list's query string, parsed once for the page and the JSON API: filters
//! (status, kind, tenant, node, KV page tag), the window (`page_no`, `limit`) and, for the page,
//! how often it refreshes. Every field arrives as text so a bad value is a 400 that names it.

use serde::Deserialize;

use super::{refresh, WebError};
use crate::domain::{IncidentKind, IncidentStatus};
use crate::store::{IncidentFilter, Window};

/// Rows per list page when `limit` is not given.
pub const DEFAULT_LIMIT: i64 = 100;
/// The most rows one list page may ask for.
pub const MAX_LIMIT: i64 = 1000;

/// `?status=&kind=&tenant=&node=&page=&generation=&page_no=&limit=&refresh=` as it arrives;
/// empty means "any" (or the default).
#[derive(Debug, Default, Deserialize)]
pub struct IncidentQuery {
    status: Option<String>,
    kind: Option<String>,
    tenant: Option<String>,
    node: Option<String>,
    page: Option<String>,
    generation: Option<String>,
    page_no: Option<String>,
    limit: Option<String>,
    refresh: Option<String>,
}

/// A parsed incident list request: which incidents, which page of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListView {
    /// Which incidents.
    pub filter: IncidentFilter,
    /// Which page of them, from 1.
    pub page_no: i64,
    /// Rows per page.
    pub limit: i64,
    /// Seconds between reloads of the HTML page (0: off).
    pub refresh_s: u32,
}

fn some(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// A whole number in `lo..=hi` for query field `name`.
pub fn number(name: &str, v: &Option<String>, lo: i64, hi: i64) -> Result<Option<i64>, WebError> {
    let Some(s) = some(v) else { return Ok(None) };
    match s.parse::<i64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
        _ if hi == i64::MAX => Err(WebError::BadRequest(format!(
            "{name} must be a whole number of at least {lo}, not {s:?}"
        ))),
        _ => Err(WebError::BadRequest(format!(
            "{name} must be a whole number from {lo} to {hi}, not {s:?}"
        ))),
    }
}

impl IncidentQuery {
    /// Parses every field; the first bad one is a 400 naming it.
    pub fn parse(&self) -> Result<ListView, WebError> {
        let bad = |e: crate::domain::UnknownValue| WebError::BadRequest(e.to_string());
        let filter = IncidentFilter {
            status: some(&self.status)
                .map(str::parse::<IncidentStatus>)
                .transpose()
                .map_err(bad)?,
            kind: some(&self.kind)
                .map(str::parse::<IncidentKind>)
                .transpose()
                .map_err(bad)?,
            tenant: some(&self.tenant).map(str::to_string),
            node: some(&self.node).map(str::to_string),
            page: number("page (a KV page number)", &self.page, 0, i64::MAX)?,
            generation: number("generation", &self.generation, 0, i64::MAX)?,
        };
        let limit = number("limit", &self.limit, 1, MAX_LIMIT)?.unwrap_or(DEFAULT_LIMIT);
        // The offset of the last allowed page must fit an i64.
        let page_no = number("page_no", &self.page_no, 1, i64::MAX / MAX_LIMIT)?.unwrap_or(1);
        let refresh_s = refresh::parse(self.refresh.as_deref())?;
        Ok(ListView {
            filter,
            page_no,
            limit,
            refresh_s,
        })
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(b))
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

impl ListView {
    /// The rows of this page.
    pub fn window(&self) -> Window {
        Window {
            limit: self.limit,
            offset: (self.page_no - 1) * self.limit,
        }
    }

    /// The list URL of `filter` (only the fields that filter), at `page_no`, keeping this
    /// view's page size and refresh period when they are not the defaults.
    pub fn href_of(&self, filter: &IncidentFilter, page_no: i64) -> String {
        let mut q: Vec<(&str, String)> = Vec::new();
        if let Some(s) = filter.status {
            q.push(("status", s.as_str().into()));
        }
        if let Some(k) = filter.kind {
            q.push(("kind", k.as_str().into()));
        }
        if let Some(t) = &filter.tenant {
            q.push(("tenant", t.clone()));
        }
        if let Some(n) = &filter.node {
            q.push(("node", n.clone()));
        }
        if let Some(p) = filter.page {
            q.push(("page", p.to_string()));
        }
        if let Some(g) = filter.generation {
            q.push(("generation", g.to_string()));
        }
        if page_no != 1 {
            q.push(("page_no", page_no.to_string()));
        }
        if self.limit != DEFAULT_LIMIT {
            q.push(("limit", self.limit.to_string()));
        }
        if self.refresh_s != refresh::DEFAULT_S {
            q.push(("refresh", self.refresh_s.to_string()));
        }
        let query: Vec<String> = q
            .iter()
            .map(|(k, v)| format!("{k}={}", percent_encode(v)))
            .collect();
        if query.is_empty() {
            "/incidents".to_string()
        } else {
            format!("/incidents?{}", query.join("&"))
        }
    }

    /// This view's URL at `page_no`.
    pub fn href(&self, page_no: i64) -> String {
        self.href_of(&self.filter, page_no)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Result<ListView, WebError> {
        let text: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let q: IncidentQuery = serde_urlencoded_like(&text.join("&"));
        q.parse()
    }

    /// Builds the struct as axum's `Query` would, without pulling in another crate.
    fn serde_urlencoded_like(s: &str) -> IncidentQuery {
        let mut m = serde_json::Map::new();
        for pair in s.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            m.insert(k.to_string(), serde_json::Value::String(v.to_string()));
        }
        serde_json::from_value(serde_json::Value::Object(m)).unwrap()
    }

    #[test]
    fn defaults_and_windows() {
        let v = q(&[]).unwrap();
        assert_eq!((v.page_no, v.limit, v.refresh_s), (1, DEFAULT_LIMIT, 30));
        assert_eq!(v.window(), Window::default());
        let v = q(&[("page_no", "3"), ("limit", "20")]).unwrap();
        assert_eq!(
            v.window(),
            Window {
                limit: 20,
                offset: 40
            }
        );
        assert_eq!(v.href(4), "/incidents?page_no=4&limit=20");
    }

    #[test]
    fn page_tags_filter_and_round_trip_through_links() {
        let v = q(&[("node", "decode 0"), ("page", "42"), ("kind", "quarantine")]).unwrap();
        assert_eq!(v.filter.page, Some(42));
        assert_eq!(v.filter.node.as_deref(), Some("decode 0"));
        assert_eq!(
            v.href(2),
            "/incidents?kind=quarantine&node=decode%200&page=42&page_no=2"
        );
    }

    #[test]
    fn bad_values_are_400s_naming_the_field() {
        for (k, v, names) in [
            ("page_no", "0", "page_no"),
            ("page_no", "two", "page_no"),
            ("page_no", "99999999999999999999", "page_no"),
            ("limit", "5000", "limit"),
            ("limit", "-1", "limit"),
            ("page", "-3", "KV page"),
            ("page", "x1", "KV page"),
            ("generation", "1.5", "generation"),
            ("refresh", "1", "refresh"),
            ("status", "closed", "incident status"),
            ("kind", "made_up", "incident kind"),
        ] {
            match q(&[(k, v)]) {
                Err(WebError::BadRequest(m)) => assert!(m.contains(names), "{k}={v}: {m}"),
                other => panic!("{k}={v}: {other:?}"),
            }
        }
        assert_eq!(q(&[("refresh", "0")]).unwrap().refresh_s, 0);
    }
}

//! HTML building blocks: the page layout, times, status badges, as `maud` markup (which
//! escapes every text and attribute value it is given).

use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::session::SessionUser;
use crate::domain::{IncidentStatus, Severity, UnixMs};

/// `path` when it is a path of this site: one leading `/`, then printable ASCII with no `\\`,
/// no space or control character, and no second `/` right after the first, before or after
/// one percent-decoding (a browser drops tabs and newlines from a URL, so `/%09/host` would
/// become `//host`, another site). Anything else a form field carries could point elsewhere.
pub fn same_site_path(path: &str) -> Option<&str> {
    fn plain(p: &[u8]) -> bool {
        p.first() == Some(&b'/')
            && !matches!(p.get(1), Some(b'/' | b'\\'))
            && p.iter().all(|&c| (0x21..=0x7e).contains(&c) && c != b'\\')
    }
    // Once decoded, an escaped space or non-ASCII letter is fine; control characters and a
    // second leading `/` or `\\` are not.
    fn decoded_plain(p: &[u8]) -> bool {
        p.first() == Some(&b'/')
            && !matches!(p.get(1), Some(b'/' | b'\\'))
            && p.iter().all(|&c| c >= 0x20 && c != 0x7f && c != b'\\')
    }
    let bytes = path.as_bytes();
    (plain(bytes) && decoded_plain(&percent_decoded(bytes))).then_some(path)
}

/// `p` with each `%XX` decoded once (an invalid escape is kept as it is).
fn percent_decoded(p: &[u8]) -> Vec<u8> {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(p.len());
    let mut i = 0;
    while i < p.len() {
        let escaped = (p[i] == b'%')
            .then(|| Some(hex(*p.get(i + 1)?)? << 4 | hex(*p.get(i + 2)?)?))
            .flatten();
        match escaped {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(p[i]);
                i += 1;
            }
        }
    }
    out
}

/// The hidden field carrying `user`'s CSRF token, for every form of a signed-in page.
pub fn csrf_input(user: &SessionUser) -> Markup {
    html! { input type="hidden" name="csrf" value=(user.csrf); }
}

/// An optional text, `—` when absent (escaped where it is rendered).
pub fn opt(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or("—")
}

/// An optional value as text, `—` when absent.
pub fn dash_or<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "—".to_string(), |v| v.to_string())
}

/// `ok` or `bad`, the class of a cell that passed or failed.
pub fn ok_class(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "bad"
    }
}

/// A time as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn time(t: UnixMs) -> String {
    let secs = t.0.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil-from-days (H. Hinnant), proleptic Gregorian.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A colored badge for an incident status.
pub fn status_badge(s: IncidentStatus) -> Markup {
    let color = match s {
        IncidentStatus::Open => "#c0392b",
        IncidentStatus::Acknowledged => "#d68910",
        IncidentStatus::Resolved => "#1e8449",
    };
    html! {
        span class={ "badge status-" (s) } style={ "background:" (color) } { (s) }
    }
}

/// A colored badge for a severity.
pub fn severity_badge(s: Severity) -> Markup {
    let color = super::chart::severity_color(s);
    html! { span class="badge" style={ "background:" (color) } { (s) } }
}

const NAV: &[(&str, &str)] = &[
    ("/overview", "Overview"),
    ("/incidents", "Incidents"),
    ("/nodes", "Nodes"),
    ("/probes", "Probes"),
    ("/tenants", "Tenants"),
    ("/integrity", "Over time"),
];

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0;color:#1b2631}\
header{background:#1b2631;color:#fff;padding:.6em 1em;display:flex;gap:1.5em;align-items:center}\
header a{color:#d6eaf8;text-decoration:none}header a.active{color:#fff;font-weight:bold}\
main{padding:1em}table{border-collapse:collapse;width:100%;font-size:.9em}\
th,td{border-bottom:1px solid #d5d8dc;padding:.35em .5em;text-align:left;vertical-align:top}\
th{background:#f2f3f4}.badge{color:#fff;border-radius:3px;padding:.1em .45em;font-size:.85em}\
form.inline{display:inline-flex;gap:.3em;margin:0}input,select,button{font-size:.9em}\
pre{background:#f8f9f9;padding:.6em;white-space:pre-wrap}.bad{color:#c0392b;font-weight:bold}\
.ok{color:#1e8449}.who{margin-left:auto;color:#d6eaf8}.muted{color:#566573;font-size:.85em}\
nav.pager{margin:.8em 0;display:flex;gap:1em;align-items:center}\
a.page-tag{font-family:monospace;background:#eaf2f8;padding:0 .3em;border-radius:3px}\
#routine{background:#f8f9f9;padding:.4em .6em;border-left:3px solid #7f8c8d}\
svg{max-width:100%;height:auto}";

/// Wraps `body` in the layout, with `active` highlighted in the navigation and, when someone
/// is signed in, their name, role and a sign-out button.
pub fn page(title: &str, active: &str, user: Option<&SessionUser>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " · Pagewarden auditor" }
                // A constant of this file, not data.
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    strong { "Pagewarden auditor" }
                    @if user.is_some() {
                        @for (href, label) in NAV {
                            a href=(href) class=[(*href == active).then_some("active")] {
                                (label)
                            }
                        }
                    }
                    @if let Some(u) = user {
                        span class="who" id="signed-in" {
                            (u.who.name) " (" (u.who.role.as_str()) ")"
                        }
                        form class="inline" method="post" action="/logout" {
                            (csrf_input(u))
                            button type="submit" id="sign-out" { "Sign out" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_of_this_site_are_redirect_targets() {
        for ok in ["/", "/incidents", "/incidents/3?x=1&y=%20", "/a%2Fb"] {
            assert_eq!(same_site_path(ok), Some(ok), "{ok}");
        }
        for bad in [
            "",
            "incidents",
            "//other-host/x",
            "/\\other-host",
            "\\\\other-host",
            "/\t/other-host/x",
            "/%09/other-host/x",
            "/%0d%0a/other-host",
            "/%2F/other-host",
            "/%5Cother-host",
            "/x\r\nSet-Cookie: a=b",
            "/x y",
            "/caf\u{e9}",
            "https://other-host/",
            "javascript:alert(1)",
        ] {
            assert_eq!(same_site_path(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_layout_escapes_the_title_and_the_user() {
        use crate::accounts::{Principal, Role};
        let user = SessionUser {
            who: Principal {
                name: "<b>eve</b>".into(),
                role: Role::Viewer,
            },
            csrf: "\"><i>".into(),
        };
        let html = page(
            "a <title> & more",
            "/tenants",
            Some(&user),
            html! { p { "body" } },
        )
        .into_string();
        assert!(!html.contains("<b>eve") && !html.contains("<i>"), "{html}");
        assert!(html.contains("<title>a &lt;title&gt; &amp; more · Pagewarden auditor</title>"));
        assert!(html.contains("<h1>a &lt;title&gt; &amp; more</h1><p>body</p>"));
        assert!(html.contains("id=\"signed-in\">&lt;b&gt;eve&lt;/b&gt; (viewer)</span>"));
        assert!(html.contains("name=\"csrf\" value=\"&quot;&gt;&lt;i&gt;\""));
        assert!(html.contains("<a href=\"/tenants\" class=\"active\">Tenants</a>"));
        assert!(html.contains("<a href=\"/nodes\">Nodes</a>"));
    }

    #[test]
    fn formats_times_in_utc() {
        assert_eq!(time(UnixMs(0)), "1970-01-01 00:00:00");
        assert_eq!(time(UnixMs(1_709_210_096_000)), "2024-02-29 12:34:56");
    }
}

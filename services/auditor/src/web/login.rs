//! Signing in and out of the web UI: `GET /login`, `POST /login`, `POST /logout`.

use axum::extract::{Query, State};
use std::time::Instant;

use axum::http::header::{RETRY_AFTER, SET_COOKIE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use maud::{html, Markup};
use pagewarden_common::edge::Connection;
use serde::Deserialize;

use super::html::{page, same_site_path};
use super::session::{current, SessionUser};
use super::{AppState, WebError};

/// `?next=` of the sign-in page: where to go once signed in.
#[derive(Debug, Default, Deserialize)]
pub struct NextQuery {
    #[serde(default)]
    next: String,
}

fn form(next: &str, error: Option<&str>) -> Markup {
    let body = html! {
        @if let Some(e) = error {
            p id="login-error" class="bad" { (e) }
        }
        form id="login" method="post" action="/login" {
            input type="hidden" name="next" value=(next);
            p {
                label {
                    "name "
                    input name="name" id="name" autocomplete="username" required;
                }
            }
            p {
                label {
                    "password "
                    input name="password" id="password" type="password"
                        autocomplete="current-password" required;
                }
            }
            p { button type="submit" id="sign-in" { "Sign in" } }
        }
    };
    page("Sign in", "", None, body)
}

/// `GET /login?next=`
pub async fn login_page(Query(q): Query<NextQuery>) -> Markup {
    form(&q.next, None)
}

/// The sign-in form as posted.
#[derive(Deserialize)]
pub struct LoginForm {
    name: String,
    password: String,
    #[serde(default)]
    next: String,
}

/// `POST /login`: a session cookie and a redirect to `next`, or the form again with a 401.
pub async fn login(
    State(st): State<AppState>,
    conn: Option<Extension<Connection>>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let next = same_site_path(&f.next).unwrap_or("/incidents").to_string();
    let addr = conn.map(|Extension(c)| c.peer().ip());
    let name = f.name.trim().to_string();
    // A blocked try is answered before its password is hashed: a flood costs nothing.
    if let Some(wait) = st.auth.throttle.wait(addr, &name, Instant::now()) {
        let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
        let page = form(
            &next,
            Some(&format!("too many failed sign-ins: try again in {secs} s")),
        );
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(RETRY_AFTER, secs.to_string())],
            page,
        )
            .into_response();
    }
    match st.auth.login(name.clone(), f.password).await {
        Some(id) => {
            st.auth.throttle.succeeded(addr, &name);
            tracing::info!(name = %f.name.trim(), "operator signed in");
            (
                [(SET_COOKIE, st.auth.cookie(&headers, Some(&id)))],
                Redirect::to(&next),
            )
                .into_response()
        }
        None => {
            st.auth.throttle.failed(addr, &name, Instant::now());
            tracing::warn!(name = %f.name.trim(), "sign-in refused");
            let page = form(&next, Some("wrong name or password"));
            (StatusCode::UNAUTHORIZED, page).into_response()
        }
    }
}

/// The sign-out form as posted.
#[derive(Deserialize)]
pub struct LogoutForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /logout`: ends the session and clears the cookie.
pub async fn logout(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    headers: HeaderMap,
    Form(f): Form<LogoutForm>,
) -> Result<Response, WebError> {
    user.check_csrf(&f.csrf)?;
    if let Some((id, _)) = current(&st, &headers) {
        st.auth.logout(&id);
    }
    Ok((
        [(SET_COOKIE, st.auth.cookie(&headers, None))],
        Redirect::to("/login"),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_escapes_next_and_the_error() {
        let html = form("/x\"><script>alert(1)</script>", Some("<b>no</b>")).into_string();
        assert!(
            !html.contains("<script>") && !html.contains("<b>no"),
            "{html}"
        );
        assert!(html
            .contains("name=\"next\" value=\"/x&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;\""));
        assert!(html.contains("<p id=\"login-error\" class=\"bad\">&lt;b&gt;no&lt;/b&gt;</p>"));
        assert!(html.contains("id=\"sign-in\"") && !html.contains("id=\"sign-out\""));
    }
}

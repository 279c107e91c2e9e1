//! The pager under a long list: newer and older links around "page N of M · T things".

use maud::{html, Markup};

/// How many pages of `per_page` rows `total` rows fill (at least one).
pub fn pages(total: i64, per_page: i64) -> i64 {
    ((total + per_page - 1) / per_page).max(1)
}

/// The pager of page `page_no` of a list of `total` `noun`s, `per_page` a page; `href(n)` is
/// the URL of page `n`. A page past the end links back to the last page.
pub fn pager(
    page_no: i64,
    per_page: i64,
    total: i64,
    noun: &str,
    href: impl Fn(i64) -> String,
) -> Markup {
    let pages = pages(total, per_page);
    html! {
        nav class="pager" id="pager" {
            @if page_no > 1 {
                a id="newer" href=(href((page_no - 1).min(pages))) { "« newer" }
            }
            span id="page-of" {
                "page " (page_no) " of " (pages) " · " (total) " " (noun)
                @if total != 1 { "s" }
            }
            @if page_no < pages {
                a id="older" href=(href(page_no + 1)) { "older »" }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_the_pages_around_this_one() {
        let href = |n| format!("/x?p={n}&a=1");
        let first = pager(1, 20, 41, "run", href).into_string();
        assert!(first.contains("page 1 of 3 · 41 runs"), "{first}");
        assert!(!first.contains("newer"), "{first}");
        assert!(first.contains("href=\"/x?p=2&amp;a=1\">older"), "{first}");
        let last = pager(3, 20, 41, "run", href).into_string();
        assert!(last.contains("href=\"/x?p=2&amp;a=1\">« newer"), "{last}");
        assert!(!last.contains("older"), "{last}");
        let past = pager(9, 20, 1, "run", href).into_string();
        assert!(past.contains("page 9 of 1 · 1 run<"), "{past}");
        assert!(past.contains("href=\"/x?p=1&amp;a=1\">« newer"), "{past}");
        assert_eq!(pages(0, 20), 1);
    }
}

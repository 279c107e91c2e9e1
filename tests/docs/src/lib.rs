//! Checks the repository's markdown: every link target stays inside the repository and exists,
//! and every `#anchor` names a heading of the file it points into.
//!
//! - [`links`]: the link targets of a markdown text, outside code blocks and code spans.
//! - [`anchors`]: the anchors a markdown text's headings produce, by GitHub's rules.
//! - [`check_file`]: every offending link of one file, each with the reason.
//!
//! Only the subset of markdown the documents use is understood: inline links and images
//! (`[text](target)`, `![alt](target)`), reference definitions (`[label]: target`), autolinks
//! (`<scheme:…>`), ATX headings (`## Title`) and fenced code blocks (```` ``` ```` or `~~~`).
//! A construct outside it fails closed: a setext heading produces no anchor, so a link to it is
//! reported.
#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};

/// One link target found in a markdown text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// 1-based line of the link.
    pub line: usize,
    /// The target as written (angle brackets and title removed).
    pub target: String,
}

/// A link that does not resolve, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offender {
    /// The markdown file, relative to the repository root.
    pub file: PathBuf,
    /// 1-based line of the link.
    pub line: usize,
    /// The target as written.
    pub target: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for Offender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: ({}) {}",
            self.file.display(),
            self.line,
            self.target,
            self.reason
        )
    }
}

/// The lines of `text` that are not inside a fenced code block, with their 1-based numbers.
/// A fence is a line starting (after indentation) with three or more backticks or tildes; it
/// closes at a line of the same character, at least as long, and nothing else.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut open: Option<(char, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let fence = ['`', '~'].into_iter().find_map(|c| {
            let n = trimmed.chars().take_while(|&x| x == c).count();
            (n >= 3).then_some((c, n))
        });
        match (open, fence) {
            (None, Some(f)) => open = Some(f),
            (Some((c, n)), Some((fc, fnum)))
                if fc == c && fnum >= n && trimmed.trim_end().chars().all(|x| x == c) =>
            {
                open = None
            }
            (Some(_), _) => {}
            (None, None) => out.push((i + 1, line)),
        }
    }
    out
}

/// `line` with every code span (a run of backticks up to the next run of the same length)
/// blanked out, so that nothing inside one reads as a link.
fn without_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let r = chars[j..].iter().take_while(|&&c| c == '`').count();
                if r == run {
                    close = Some(j + r);
                    break;
                }
                j += r;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                out.extend(std::iter::repeat_n(' ', end - i));
                i = end;
            }
            None => {
                // An unmatched run is literal text.
                out.extend(std::iter::repeat_n('`', run));
                i += run;
            }
        }
    }
    out
}

/// The target inside `(…)` starting just after the opening parenthesis at `chars[start]`:
/// `<target>` or the first whitespace-free run, parentheses balanced. `None` when the
/// parenthesis never closes on this line.
fn inline_target(chars: &[char], start: usize) -> Option<(String, usize)> {
    let mut i = start;
    while i < chars.len() && chars[i] == ' ' {
        i += 1;
    }
    let mut target = String::new();
    if chars.get(i) == Some(&'<') {
        i += 1;
        while i < chars.len() && chars[i] != '>' {
            target.push(chars[i]);
            i += 1;
        }
        i += 1;
    } else {
        let mut depth = 0usize;
        while i < chars.len() {
            match chars[i] {
                '(' => depth += 1,
                ')' if depth == 0 => break,
                ')' => depth -= 1,
                c if c.is_whitespace() => break,
                _ => {}
            }
            target.push(chars[i]);
            i += 1;
        }
    }
    // Skip an optional title up to the closing parenthesis.
    let mut depth = 0usize;
    while i < chars.len() {
        match chars[i] {
            '(' => depth += 1,
            ')' if depth == 0 => return Some((target, i + 1)),
            ')' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    None
}

/// Every link target of `text` outside fenced code blocks and code spans: inline links and
/// images, reference definitions and autolinks, in order.
pub fn links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for (n, raw) in prose_lines(text) {
        let line = without_code_spans(raw);
        let trimmed = line.trim_start();
        // A reference definition: `[label]: target`.
        if let Some(rest) = trimmed.strip_prefix('[') {
            if let Some((label, after)) = rest.split_once("]:") {
                if !label.is_empty() && !label.contains(']') {
                    if let Some(target) = after.split_whitespace().next() {
                        let target = target.trim_start_matches('<').trim_end_matches('>');
                        out.push(Link {
                            line: n,
                            target: target.to_string(),
                        });
                        continue;
                    }
                }
            }
        }
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '\\' => i += 2,
                '<' => {
                    // An autolink: `<scheme:…>` with no space inside.
                    let end = chars[i + 1..].iter().position(|&c| c == '>' || c == ' ');
                    match end.map(|e| i + 1 + e) {
                        Some(e) if chars[e] == '>' => {
                            let inner: String = chars[i + 1..e].iter().collect();
                            if has_scheme(&inner) {
                                out.push(Link {
                                    line: n,
                                    target: inner,
                                });
                            }
                            i = e + 1;
                        }
                        _ => i += 1,
                    }
                }
                '[' => {
                    // The matching `]`, brackets nested, then `(` right after it.
                    let mut depth = 0usize;
                    let mut j = i + 1;
                    let mut close = None;
                    while j < chars.len() {
                        match chars[j] {
                            '\\' => j += 1,
                            '[' => depth += 1,
                            ']' if depth == 0 => {
                                close = Some(j);
                                break;
                            }
                            ']' => depth -= 1,
                            _ => {}
                        }
                        j += 1;
                    }
                    match close {
                        Some(c) if chars.get(c + 1) == Some(&'(') => {
                            match inline_target(&chars, c + 2) {
                                Some((target, end)) => {
                                    out.push(Link { line: n, target });
                                    // The link text may hold an image link: scan it too.
                                    let inner: String = chars[i + 1..c].iter().collect();
                                    for l in links(&inner) {
                                        out.push(Link {
                                            line: n,
                                            target: l.target,
                                        });
                                    }
                                    i = end;
                                }
                                None => i = c + 1,
                            }
                        }
                        _ => i += 1,
                    }
                }
                _ => i += 1,
            }
        }
    }
    out
}

/// Whether `target` starts with a URI scheme (`https:`, `mailto:`, `file:`, …).
fn has_scheme(target: &str) -> bool {
    let Some((scheme, _)) = target.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// A heading's anchor by GitHub's rules: the rendered text lowercased, every character other
/// than a letter, a digit, `-`, `_` or a space dropped, and spaces turned into `-`.
pub fn slug(heading: &str) -> String {
    let mut text = String::new();
    // Render links to their text; code spans and emphasis markers are punctuation, dropped below.
    let chars: Vec<char> = heading.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '[' {
            if let Some(c) = chars[i..].iter().position(|&x| x == ']').map(|c| i + c) {
                if chars.get(c + 1) == Some(&'(') {
                    if let Some((_, end)) = inline_target(&chars, c + 2) {
                        text.extend(&chars[i + 1..c]);
                        i = end;
                        continue;
                    }
                }
            }
        }
        text.push(chars[i]);
        i += 1;
    }
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor the ATX headings of `text` produce (outside code blocks), in order; a repeated
/// slug gets `-1`, `-2`, … as on GitHub.
pub fn anchors(text: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for (_, line) in prose_lines(text) {
        let trimmed = line.trim_start();
        if line.len() - trimmed.len() > 3 {
            continue;
        }
        let level = trimmed.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&level) {
            continue;
        }
        let rest = &trimmed[level..];
        if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
            continue;
        }
        // An optional closing sequence of `#`s, after a space.
        let mut title = rest.trim();
        let stripped = title.trim_end_matches('#');
        if stripped.is_empty() || stripped.ends_with(' ') {
            title = stripped.trim_end();
        }
        let base = slug(title);
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 { base } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// `%XX` escapes decoded (as a browser would before looking the path up); malformed escapes
/// are left as they are.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` with `.` and `..` folded away without touching the file system; `None` when a `..`
/// climbs above where `path` started.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Why `target`, a link in the markdown file `file` (relative to `root`), does not resolve;
/// `None` when it does.
pub fn problem(root: &Path, file: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("empty link target".into());
    }
    if has_scheme(target) {
        return Some(if target.to_ascii_lowercase().starts_with("mailto:") {
            "a mailto link: documents link only to files in the repository".into()
        } else {
            "an absolute URL: documents link only to files in the repository, by relative path"
                .into()
        });
    }
    if target.starts_with('/') {
        return Some("an absolute path: write it relative to this file".into());
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(percent_decode(a))),
        None => (target, None),
    };
    let path = percent_decode(path.split('?').next().unwrap_or(""));
    let linked = if path.is_empty() {
        file.to_path_buf()
    } else {
        let dir = file.parent().unwrap_or(Path::new(""));
        match normalize(&dir.join(&path)) {
            Some(p) => p,
            None => return Some("resolves outside the repository".into()),
        }
    };
    let full = root.join(&linked);
    if !full.exists() {
        return Some(format!("{} does not exist", linked.display()));
    }
    // A symbolic link may still lead out of the repository.
    match (full.canonicalize(), root.canonicalize()) {
        (Ok(f), Ok(r)) if f.starts_with(&r) => {}
        _ => return Some("resolves outside the repository".into()),
    }
    let anchor = anchor?;
    if full.is_dir() || full.extension().is_none_or(|e| e != "md") {
        return Some(format!(
            "#{anchor} points into {}, which is no markdown file",
            linked.display()
        ));
    }
    let text = match std::fs::read_to_string(&full) {
        Ok(t) => t,
        Err(e) => return Some(format!("cannot read {}: {e}", linked.display())),
    };
    if anchors(&text).contains(&anchor) {
        None
    } else {
        Some(format!(
            "no heading of {} produces #{anchor}",
            linked.display()
        ))
    }
}

/// Every offending link of the markdown file `file` (relative to `root`).
pub fn check_file(root: &Path, file: &Path) -> Result<Vec<Offender>, std::io::Error> {
    let text = std::fs::read_to_string(root.join(file))?;
    Ok(links(&text)
        .into_iter()
        .filter_map(|l| {
            problem(root, file, &l.target).map(|reason| Offender {
                file: file.to_path_buf(),
                line: l.line,
                target: l.target,
                reason,
            })
        })
        .collect())
}

/// Every `.md` file under `dir` (relative to `root`), recursively, in name order.
pub fn markdown_files(root: &Path, dir: &Path) -> Result<Vec<PathBuf>, std::io::Error> {
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(root.join(dir))?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let rel = dir.join(e.file_name());
        if e.file_type()?.is_dir() {
            out.extend(markdown_files(root, &rel)?);
        } else if rel.extension().is_some_and(|x| x == "md") {
            out.push(rel);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(text: &str) -> Vec<String> {
        links(text).into_iter().map(|l| l.target).collect()
    }

    #[test]
    fn links_outside_code_only() {
        let text = "See [a](a.md) and ![img](x.png \"title\").\n\
                    ```sh\n[not](inside.md)\n```\n\
                    `[nor](span.md)` but [b](b.md#sec) and <https://x.example/y>.\n\
                    ~~~~\n[no](no.md)\n~~~\n[no](still.md)\n~~~~\n\
                    [ref]: ./ref.md\n";
        assert_eq!(
            targets(text),
            [
                "a.md",
                "x.png",
                "b.md#sec",
                "https://x.example/y",
                "./ref.md"
            ]
        );
    }

    #[test]
    fn nested_brackets_parentheses_and_images_in_links() {
        assert_eq!(
            targets("[`[x]` and more](a_(b).md) [![badge](i.svg)](page.md)"),
            ["a_(b).md", "page.md", "i.svg"]
        );
        assert_eq!(
            targets("[text] (not.md) \\[esc](no.md"),
            Vec::<String>::new()
        );
        assert_eq!(targets("[x](<with space.md>)"), ["with space.md"]);
    }

    #[test]
    fn line_numbers() {
        let l = links("one\n\n[a](a.md)\n```\n[b](b.md)\n```\n[c](c.md)");
        assert_eq!(
            l.iter().map(|l| l.line).collect::<Vec<_>>(),
            [3, 7],
            "{l:?}"
        );
    }

    #[test]
    fn github_slugs() {
        assert_eq!(slug("Set-up"), "set-up");
        assert_eq!(
            slug("Invariants: where they are enforced and tested"),
            "invariants-where-they-are-enforced-and-tested"
        );
        assert_eq!(slug("`pagewarden up`"), "pagewarden-up");
        assert_eq!(
            slug("Router (`pagewarden-router`)"),
            "router-pagewarden-router"
        );
        assert_eq!(slug("systemd (GPU hosts)"), "systemd-gpu-hosts");
        assert_eq!(
            slug("`bench fairness`, 2026-12-01"),
            "bench-fairness-2026-12-01"
        );
        assert_eq!(
            slug("A [link](x.md) and snake_case"),
            "a-link-and-snake_case"
        );
        assert_eq!(slug("`pagewarden bench …`"), "pagewarden-bench-");
    }

    #[test]
    fn anchors_of_headings_outside_code_with_duplicates_numbered() {
        let text = "# Title\n\n## Part ##\n```sh\n# a shell comment\n```\n## Part\n#no\n    # indented code\n";
        assert_eq!(anchors(text), ["title", "part", "part-1"]);
    }

    #[test]
    fn schemes() {
        for t in [
            "https://x",
            "http://x",
            "mailto:a@b",
            "file:///etc",
            "ftp://x",
        ] {
            assert!(has_scheme(t), "{t}");
        }
        for t in ["a.md", "a.md#x:y", "../a", "#x"] {
            assert!(!has_scheme(t), "{t}");
        }
    }

    #[test]
    fn normalizing_refuses_to_climb_out() {
        assert_eq!(
            normalize(Path::new("docs/../README.md")),
            Some(PathBuf::from("README.md"))
        );
        assert_eq!(normalize(Path::new("docs/../../outside/x.md")), None);
        assert_eq!(normalize(Path::new("./a/./b")), Some(PathBuf::from("a/b")));
    }

    #[test]
    fn percent_escapes() {
        assert_eq!(percent_decode("a%20b"), "a b");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}

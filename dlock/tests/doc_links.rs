//! The Markdown pages of the repository link where they say: every relative link in README.md,
//! CHANGELOG.md, `docs/*.md` and each crate's README.md names a file that exists, and its
//! `#fragment` names a heading of the target page (GitHub's anchors). Pages move between files;
//! without this, a moved section leaves dead links behind. External links are not fetched (the
//! tests run without a network), only checked to be well formed.
//!
//! Also keeps README.md a front page: at most 400 lines, with its first example near the top.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

/// The root of the workspace.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the facade lives in a folder of the workspace")
        .to_path_buf()
}

/// The pages checked: README.md, CHANGELOG.md, docs/*.md and the README.md of every crate
/// (every folder at the root with a Cargo.toml).
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("the docs folder")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    let mut crates: Vec<PathBuf> = fs::read_dir(&root)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|dir| dir.join("Cargo.toml").is_file() && dir.join("README.md").is_file())
        .map(|dir| dir.join("README.md"))
        .collect();
    crates.sort();
    pages.extend(crates);
    pages
}

/// The text of `markdown` outside fenced code blocks, one string per paragraph (blocks separated
/// by blank lines), with each paragraph's first line number.
fn prose(markdown: &str) -> Vec<(usize, String)> {
    let mut paragraphs = Vec::new();
    let mut fence: Option<&str> = None;
    let mut current = String::new();
    let mut first_line = 0;
    for (index, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(marker) = fence {
            if trimmed.starts_with(marker) {
                fence = None;
            }
            continue;
        }
        let opens = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        if opens.is_some() || trimmed.is_empty() {
            if !current.is_empty() {
                paragraphs.push((first_line, std::mem::take(&mut current)));
            }
            fence = opens;
            continue;
        }
        if current.is_empty() {
            first_line = index + 1;
        }
        current.push_str(line);
        current.push('\n');
    }
    if !current.is_empty() {
        paragraphs.push((first_line, current));
    }
    paragraphs
}

/// `text` without its inline code spans (a run of backticks up to the next run of the same
/// length), which hold no links. The line breaks inside a span stay, so lines keep their numbers.
fn without_code_spans(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].len() - rest[start..].trim_start_matches('`').len();
        let after = &rest[start + ticks..];
        let closing = "`".repeat(ticks);
        match after.find(&closing) {
            Some(end) => {
                out.extend(after[..end].matches('\n'));
                rest = &after[end + ticks..];
            }
            None => {
                // An unmatched run is literal text.
                out.push_str(&rest[start..start + ticks]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of the inline links `[text](target)` and images `![alt](target)` in the prose of
/// `markdown`, each with its line number.
fn links(markdown: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (first_line, paragraph) in prose(markdown) {
        let text = without_code_spans(&paragraph);
        let mut from = 0;
        while let Some(at) = text[from..].find("](").map(|at| from + at) {
            let after = &text[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            // A title ("…") may follow the target; angle brackets may enclose it.
            let target = after[..end].split_whitespace().next().unwrap_or("");
            let target = target.trim_start_matches('<').trim_end_matches('>');
            let line = first_line + text[..at].matches('\n').count();
            found.push((line, target.to_owned()));
            from = at + 2 + end;
        }
    }
    found
}

/// The text a heading renders: code spans without their backticks, links as their text.
fn rendered(heading: &str) -> String {
    let mut text = heading.replace('`', "");
    while let Some(mid) = text.find("](") {
        let (Some(open), Some(close)) = (text[..mid].rfind('['), text[mid..].find(')')) else {
            break;
        };
        let close = mid + close;
        text = format!(
            "{}{}{}",
            &text[..open],
            &text[open + 1..mid],
            &text[close + 1..]
        );
    }
    text
}

/// GitHub's anchor for a heading: its rendered text, lowercase, every character other than a
/// letter, a digit, a space, `-` or `_` removed, and spaces turned into `-`.
fn slug(heading: &str) -> String {
    rendered(heading)
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of the headings of `markdown`: a repeated heading gets `-1`, `-2`, … after its
/// first occurrence, as on GitHub.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = BTreeSet::new();
    for (_, paragraph) in prose(markdown) {
        for line in paragraph.lines() {
            let hashes = line.len() - line.trim_start_matches('#').len();
            if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
                continue;
            }
            let base = slug(line[hashes..].trim().trim_end_matches('#'));
            let count = seen.entry(base.clone()).or_insert(0);
            anchors.insert(if *count == 0 {
                base.clone()
            } else {
                format!("{base}-{count}")
            });
            *count += 1;
        }
    }
    anchors
}

/// `path` as shown in a failure: relative to the workspace's root.
fn shown(path: &Path) -> String {
    let root = root();
    path.strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Why the link `target` in `page` is broken, if it is.
fn broken(page: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("the link has no target".into());
    }
    if let Some(rest) = target
        .strip_prefix("https://")
        .or_else(|| target.strip_prefix("http://"))
    {
        let host = rest.split(['/', '?', '#']).next().unwrap_or("");
        return (host.is_empty() || !host.contains('.') || host.contains(char::is_whitespace))
            .then(|| format!("{host:?} is not a host name"));
    }
    if let Some(address) = target.strip_prefix("mailto:") {
        return (!address.contains('@')).then(|| "not an e-mail address".into());
    }
    if target.contains("://") {
        return Some("an external link that is neither http, https nor mailto".into());
    }
    let (path, fragment) = match target.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        page.to_path_buf()
    } else {
        page.parent().unwrap().join(path)
    };
    if !file.exists() {
        return Some(format!("{} does not exist", shown(&file)));
    }
    let fragment = fragment?;
    if file.extension().is_none_or(|ext| ext != "md") {
        return Some(format!(
            "#{fragment} in {}, which is not a Markdown page",
            shown(&file)
        ));
    }
    let markdown = fs::read_to_string(&file).unwrap();
    let anchors = anchors(&markdown);
    (!anchors.contains(fragment)).then(|| {
        format!(
            "{} has no heading with the anchor #{fragment} (its anchors: {anchors:?})",
            shown(&file)
        )
    })
}

#[test]
fn every_relative_link_names_an_existing_file_and_heading() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let markdown = fs::read_to_string(&page).unwrap();
        for (line, target) in links(&markdown) {
            checked += 1;
            if let Some(why) = broken(&page, &target) {
                failures.push(format!("{}:{line}: ({target}): {why}", shown(&page)));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser broken?"
    );
    assert!(
        failures.is_empty(),
        "broken links:\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 400, "README.md has {lines} lines; at most 400");
    let first_example = readme
        .lines()
        .position(|line| line.trim_start().starts_with("```rust"))
        .map(|index| index + 1)
        .expect("README.md has a ```rust example");
    assert!(
        first_example <= 120,
        "README.md's first ```rust block starts on line {first_example}; it must start within the first 120"
    );
}

#[test]
fn the_parser_finds_links_outside_code_only() {
    let page = "# Title\n\n[a](x.md) and `[b](y.md)`\n\n```text\n[c](z.md)\n```\n\n\
                `a\nspan` then ![d](e.png \"t\")\n";
    assert_eq!(
        links(page),
        [(3, "x.md".to_owned()), (10, "e.png".to_owned())]
    );
}

#[test]
fn anchors_follow_githubs_rules() {
    let page = "# The `dlock` command\n\n## Redis: primitives\n\n## Notes\n\n## Notes\n\n\
                ### See [the guide](x.md)\n\n```sh\n# not a heading\n```\n";
    let expected: BTreeSet<String> = [
        "the-dlock-command",
        "redis-primitives",
        "notes",
        "notes-1",
        "see-the-guide",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(anchors(page), expected);
}

//! The documentation holds together: README.md (the front page), the book in docs/ and the
//! files it includes. Every relative link and `#anchor` resolves, every chapter is in the book's
//! SUMMARY, every config key acpd accepts is documented, and the front page keeps the two
//! fresh-machine commands `.ci/run` runs. Checked on the Markdown, so it needs no mdbook.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate sits in the workspace")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The page as mdbook renders it: `{{#include FILE}}` replaced by FILE's text (only whole-file
/// includes are used, so a line range or anchor is a failure here rather than a silent miss).
fn expanded(path: &Path) -> String {
    expanded_within(path, 0)
}

fn expanded_within(path: &Path, depth: usize) -> String {
    assert!(
        depth < 8,
        "{}: includes nest deeper than 8 (a cycle?)",
        path.display()
    );
    let text = read(path);
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("{{#include ") {
        out.push_str(&rest[..start]);
        let after = &rest[start + "{{#include ".len()..];
        let end = after
            .find("}}")
            .unwrap_or_else(|| panic!("{}: unclosed {{{{#include", path.display()));
        let target = after[..end].trim();
        assert!(
            !target.contains(':'),
            "{}: include {target}: only whole files are checked",
            path.display()
        );
        out.push_str(&expanded_within(
            &path.parent().unwrap().join(target),
            depth + 1,
        ));
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

fn options() -> Options {
    Options::ENABLE_TABLES | Options::ENABLE_FOOTNOTES | Options::ENABLE_STRIKETHROUGH
}

/// mdbook's heading id (mdbook-html `id_from_content`, the same as GitHub's for these headings):
/// the heading's text lowercased, alphanumerics, `_` and `-` kept, whitespace turned into `-`,
/// the rest dropped; a repeat gets `-1`, `-2`, ….
fn heading_ids(markdown: &str) -> HashSet<String> {
    let mut ids = HashSet::new();
    let mut text: Option<String> = None;
    for event in Parser::new_ext(markdown, options()) {
        match event {
            Event::Start(Tag::Heading { .. }) => text = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = text.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let h = text.take().unwrap_or_default();
                let id: String = h
                    .trim()
                    .to_lowercase()
                    .chars()
                    .filter_map(|c| match c {
                        c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c),
                        c if c.is_whitespace() => Some('-'),
                        _ => None,
                    })
                    .collect();
                let mut unique = id.clone();
                let mut n = 1;
                while !ids.insert(unique.clone()) {
                    unique = format!("{id}-{n}");
                    n += 1;
                }
            }
            _ => {}
        }
    }
    ids
}

fn links(markdown: &str) -> Vec<String> {
    Parser::new_ext(markdown, options())
        .filter_map(|event| match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                Some(dest_url.to_string())
            }
            _ => None,
        })
        .collect()
}

/// `a/./b/../c` → `a/c`, without touching the filesystem (the target may not exist).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The pages checked: the front page, ARCHITECTURE.md, and every Markdown file under docs/
/// (the book's chapters and the files they include), each as rendered (includes expanded).
fn pages() -> Vec<PathBuf> {
    let root = repo();
    let mut pages = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let entry = entry.unwrap();
            let path = entry.path();
            if path.file_name().is_some_and(|n| n == "book") {
                continue; // mdbook's output
            }
            // Not followed through a symbolic link, so a link loop cannot hang the walk.
            if entry.file_type().unwrap().is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = repo();
    let book = root.join("docs/src");
    let mut ids: HashMap<PathBuf, HashSet<String>> = HashMap::new();
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = expanded(&page);
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = link.split_once('#').unwrap_or((link.as_str(), ""));
            if file.starts_with('/') {
                // Root-relative: resolves differently on GitHub and in the published book.
                broken.push(format!("{}: ({link}): an absolute path", page.display()));
                continue;
            }
            let target = if file.is_empty() {
                page.clone()
            } else {
                normalize(&page.parent().unwrap().join(file))
            };
            let shown = format!(
                "{}: ({link})",
                page.strip_prefix(&root).unwrap_or(&page).display()
            );
            if !target.exists() {
                broken.push(format!("{shown}: no {}", target.display()));
                continue;
            }
            // The book is published on its own: a chapter must not link out of docs/src.
            if page.starts_with(&book) && !target.starts_with(&book) {
                broken.push(format!("{shown}: leaves the book (docs/src)"));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            if target.extension().is_none_or(|e| e != "md") {
                broken.push(format!(
                    "{shown}: an anchor into a file that is not Markdown"
                ));
                continue;
            }
            let known = ids
                .entry(target.clone())
                .or_insert_with(|| heading_ids(&expanded(&target)));
            if !known.contains(anchor) {
                broken.push(format!("{shown}: no heading with id \"{anchor}\""));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 50,
        "only {checked} relative links found: is the parser reading the pages?"
    );
}

#[test]
fn every_chapter_is_in_the_summary() {
    let book = repo().join("docs/src");
    let listed: BTreeSet<String> = links(&read(&book.join("SUMMARY.md"))).into_iter().collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&book).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && name != "SUMMARY.md" && !listed.contains(&name) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/src chapters not in SUMMARY.md: {missing:?}"
    );
}

/// The field names of `struct NAME` in the config's raw schema: the keys a config file may use.
fn schema_keys(schema: &str, name: &str) -> Vec<String> {
    let start = schema
        .find(&format!("struct {name} {{"))
        .unwrap_or_else(|| panic!("daemon/src/config/schema.rs has no struct {name}"));
    let body = &schema[start..];
    let body = &body[..body.find("\n}").expect("the struct ends")];
    body.lines()
        .filter_map(|l| l.trim().strip_prefix("pub(super) "))
        .filter_map(|l| l.split_once(':').map(|(k, _)| k.trim().to_string()))
        .collect()
}

#[test]
fn every_config_key_is_documented_in_the_configuration_chapter() {
    let schema = read(&repo().join("daemon/src/config/schema.rs"));
    let chapter = read(&repo().join("docs/src/configuration.md"));
    let mut keys = schema_keys(&schema, "RawConfig");
    keys.extend(schema_keys(&schema, "RawProvider"));
    assert!(keys.len() > 30, "read only {keys:?} from the schema");
    let undocumented: Vec<&String> = keys
        .iter()
        .filter(|k| *k != "providers")
        .filter(|k| {
            !chapter.contains(&format!("\n{k} =")) && !chapter.contains(&format!("# {k} ="))
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "config keys with no `KEY = …` line in docs/src/configuration.md: {undocumented:?}"
    );
}

#[test]
fn the_front_page_keeps_the_fresh_machine_commands_ci_runs() {
    let readme = read(&repo().join("README.md"));
    let ci = read(&repo().join(".ci/run"));
    for (readme_has, ci_has) in [
        (
            "cargo run --release -- run \"hello\"",
            "cargo run --release -- run \"",
        ),
        ("cargo test --workspace", "cargo test --workspace"),
    ] {
        assert!(
            readme.contains(&format!("```sh\n{readme_has}\n```")),
            "README.md lost its command block `{readme_has}`"
        );
        assert!(ci.contains(ci_has), ".ci/run no longer runs `{ci_has}`");
    }
    let top = readme.lines().filter(|l| l.starts_with("## ")).count();
    assert!(
        readme.len() < 8 * 1024 && top <= 8,
        "README.md is the front page ({} bytes, {top} sections): the reference goes in docs/",
        readme.len()
    );
}

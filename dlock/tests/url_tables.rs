//! The two tables of `dlock::connect` URLs in `docs/urls.md` — schemes and parameters — say
//! exactly what the code accepts: every scheme the facade maps and every parameter each backend
//! takes, no more and no fewer.

#![cfg(all(
    feature = "redis",
    feature = "redis-tls",
    feature = "redlock",
    feature = "zk",
    feature = "etcd",
    feature = "postgres"
))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use dlock::url::FromUrl;

const URLS: &str = include_str!("../../docs/urls.md");

/// The rows of the first Markdown table after the line starting with `header`, cut into cells.
fn table(header: &str) -> Vec<Vec<String>> {
    let start = URLS
        .find(header)
        .unwrap_or_else(|| panic!("docs/urls.md has no table headed {header:?}"));
    URLS[start..]
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            line.trim_matches('|')
                .split(" | ")
                .map(|cell| cell.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The words in backticks in `cell`.
fn quoted(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Each backend's schemes and parameters, as the code declares them.
fn backends() -> BTreeMap<&'static str, (Vec<&'static str>, Vec<&'static str>)> {
    fn of<B: FromUrl>() -> (Vec<&'static str>, Vec<&'static str>) {
        (B::SCHEMES.to_vec(), B::PARAMETERS.to_vec())
    }
    BTreeMap::from([
        (
            "memory",
            (vec!["memory"], dlock::MEMORY_PARAMETERS.to_vec()),
        ),
        ("redis", of::<dlock::redis::RedisLockBuilder>()),
        ("redlock", of::<dlock::redlock::RedlockBuilder>()),
        ("zk", of::<dlock::zk::ZkLockBuilder>()),
        ("etcd", of::<dlock::etcd::EtcdLockBuilder>()),
        ("postgres", of::<dlock::postgres::PgLockBuilder>()),
    ])
}

#[test]
fn the_scheme_table_names_every_scheme_and_its_backend() {
    let mut documented: BTreeMap<String, String> = BTreeMap::new();
    for row in table("| URL | backend | feature |") {
        let backend = quoted(&row[1]).into_iter().next().expect("a backend name");
        for url in quoted(&row[0]).into_iter().filter(|u| u.contains("://")) {
            let scheme = url.split("://").next().unwrap().to_owned();
            documented.insert(scheme, backend.clone());
        }
    }
    let mut declared: BTreeMap<String, String> = BTreeMap::new();
    for (backend, (schemes, _)) in backends() {
        for scheme in schemes {
            declared.insert(scheme.to_owned(), backend.to_owned());
        }
    }
    assert_eq!(documented, declared);
    let mapped: BTreeSet<String> = dlock::SCHEMES
        .iter()
        .map(|(scheme, _)| scheme.to_string())
        .collect();
    assert_eq!(mapped, declared.keys().cloned().collect());
}

#[test]
fn the_parameter_table_names_every_parameter_of_every_backend() {
    let backends = backends();
    let mut documented: BTreeSet<(String, String)> = BTreeSet::new();
    for row in table("| parameter | backends | what it sets |") {
        let owners: Vec<String> = if row[1] == "every backend" {
            backends.keys().map(|b| b.to_string()).collect()
        } else {
            quoted(&row[1])
        };
        for parameter in quoted(&row[0]) {
            for owner in &owners {
                documented.insert((parameter.clone(), owner.clone()));
            }
        }
    }
    let mut declared: BTreeSet<(String, String)> = BTreeSet::new();
    for (backend, (_, parameters)) in &backends {
        for parameter in dlock::COMMON_PARAMETERS.iter().chain(parameters) {
            declared.insert((parameter.to_string(), backend.to_string()));
        }
    }
    assert_eq!(documented, declared);
}

#[test]
fn every_production_example_parses() {
    let start = URLS
        .find("each of these production forms")
        .expect("the production examples of docs/urls.md");
    let block = URLS[start..]
        .split("```text\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a text block of URLs");
    let mut seen = BTreeSet::new();
    for url in block.lines().filter(|l| !l.trim().is_empty()) {
        let scheme = url.split("://").next().unwrap();
        let backend = backends()
            .into_iter()
            .find(|(_, (schemes, _))| schemes.contains(&scheme))
            .map(|(backend, _)| backend)
            .unwrap_or_else(|| panic!("{url}: no backend serves {scheme}://"));
        let parsed = match backend {
            "redis" => parses::<dlock::redis::RedisLockBuilder>(url),
            "redlock" => parses::<dlock::redlock::RedlockBuilder>(url),
            "zk" => parses::<dlock::zk::ZkLockBuilder>(url),
            "etcd" => parses::<dlock::etcd::EtcdLockBuilder>(url),
            "postgres" => parses::<dlock::postgres::PgLockBuilder>(url),
            other => panic!("{url}: no production example expected for {other}"),
        };
        parsed.unwrap_or_else(|e| panic!("{url}: {e}"));
        seen.insert(scheme.to_owned());
    }
    assert!(seen.len() >= 8, "{seen:?}");
}

/// Parses `url` as `dlock::connect` does, short of connecting: the per-acquire parameters, then
/// the backend's own, and nothing left over.
fn parses<B: FromUrl>(url: &str) -> dlock::Result<()> {
    let mut url = dlock::url::ConnectUrl::parse(url)?;
    url.expect_scheme(B::SCHEMES)?;
    for parameter in dlock::COMMON_PARAMETERS {
        url.take(parameter);
    }
    B::from_connect_url(&mut url)?;
    url.finish(B::PARAMETERS)
}

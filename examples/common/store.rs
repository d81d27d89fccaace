//! The Redis the axum and tonic examples' store flags name (`--redis`, `--redis-cluster`,
//! `--redis-sentinel` with `--sentinel-master`, `--redis-ca`), as a `RedisStoreBuilder`.

use redlimit::store::{RedisStore, RedisStoreBuilder};

use super::flags::{invalid, redacted, CliError, Given};

/// The Redis the store flags name, if any: its builder, and what `store: ...` calls it
/// (`KIND URLS`, without passwords).
pub fn redis(given: &Given) -> Result<Option<(RedisStoreBuilder, String)>, CliError> {
    let named = ["--redis", "--redis-cluster", "--redis-sentinel"];
    let named: Vec<_> = named
        .iter()
        .filter_map(|&f| Some((f, given.get(f)?)))
        .collect();
    let (flag, list) = match (&named[..], given.get("--sentinel-master")) {
        ([], None) if given.has("--redis-ca") => Err(invalid(
            "--redis-ca needs --redis rediss://..., --redis-cluster rediss://... or \
             --redis-sentinel rediss://...",
        ))?,
        ([], None) => return Ok(None),
        ([("--redis-sentinel", _)], None) => Err(invalid(
            "--redis-sentinel needs --sentinel-master NAME (the name the sentinels monitor the \
             primary under)",
        ))?,
        ([("--redis-sentinel", _)], Some(_)) | ([_], None) => named[0],
        ([], Some(_)) | ([_], Some(_)) => Err(invalid(
            "--sentinel-master needs --redis-sentinel URL,URL,... (the sentinels)",
        ))?,
        _ => Err(invalid(
            "give one of --redis, --redis-cluster and --redis-sentinel, once",
        ))?,
    };
    let master = given.get("--sentinel-master");
    let urls: Vec<&str> = match flag {
        "--redis" => vec![list],
        _ => list
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect(),
    };
    if urls.is_empty() {
        return Err(invalid(format!("{flag} needs at least one URL")));
    }
    let shown: Vec<String> = urls.iter().map(|url| redacted(url)).collect();
    let shown = format!("{} {}", &flag[2..], shown.join(","));
    let (builder, shown) = match (flag, master) {
        ("--redis", _) => (RedisStore::builder(urls[0]), shown),
        (_, None) => (RedisStore::cluster_builder(urls), shown),
        (_, Some(name)) => (
            RedisStore::sentinel_builder(urls, name),
            format!("{shown} master {name}"),
        ),
    };
    Ok(Some(match given.get("--redis-ca") {
        Some(path) => (builder.tls_ca_pem(read_ca(path)?), shown),
        None => (builder, shown),
    }))
}

/// `--redis-ca`'s file: a PEM certificate.
fn read_ca(path: &str) -> Result<Vec<u8>, CliError> {
    let pem =
        std::fs::read(path).map_err(|e| invalid(format!("--redis-ca: cannot read {path}: {e}")))?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(invalid(format!(
            "--redis-ca: {path} holds no PEM certificate"
        )));
    }
    Ok(pem)
}

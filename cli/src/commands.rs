//! The commands: each builds the fleet's limiter on the store, does what it says, and prints
//! what it did and what the key now looks like ([`Limiter::inspect`]).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use redlimit::layer::scope_quotas;
use redlimit::limiter::{ControlError, KeyStatus, StoredKey, DEFAULT_PREFIX};
use redlimit::store::RedisStore;
use redlimit::{Limiter, Quotas, Target};
use serde_json::{json, Value};

use crate::connect::Connection;
use crate::show::{self, quotas_text, seconds_text};
use crate::{Action, Failure, Request};

pub async fn run(connection: &Connection, request: &Request) -> Result<(), Failure> {
    let shown_url = connection.shown();
    let store = connection.store()?;
    store
        .verify()
        .await
        .map_err(|e| Failure::Store(format!("cannot use the Redis at {shown_url}: {e}")))?;
    let limiter = limiter(&store, request, request.algorithm)?;
    let in_redis = |e: String| Failure::Store(format!("Redis at {shown_url}: {e}"));
    if let Action::Limited { watch } = request.action {
        return match watch {
            None => {
                let rows = limited(connection, request, &limiter, &store).await;
                emit(&limited_text(request.json, &rows.map_err(in_redis)?))
            }
            Some(interval) => {
                watch_limited(connection, request, &limiter, &store, interval, in_redis).await
            }
        };
    }
    let (tenant_id, scope_id) = stored_ids(&limiter, &request.key, request.scope.as_deref());
    let stored = match &scope_id {
        Some(scope) => Target::stored(&tenant_id, Some(scope)),
        None if request.all_routes => Target::stored_all_routes(&tenant_id),
        None => Target::stored(&tenant_id, None),
    };
    let target = stored.ok_or_else(|| {
        Failure::Input(format!(
            "{} is not a key this limiter can name",
            request.shown
        ))
    })?;
    // Where the key has state: every route, its tenant's controls. An inspect of a key with
    // none at all, or of a route it has no state on, is an input error (nothing to show).
    let mut routes = Vec::new();
    if matches!(request.action, Action::Inspect) {
        let controls;
        (routes, controls) = tenant_routes(connection, &limiter, target, &tenant_id)
            .await
            .map_err(in_redis)?;
        if routes.is_empty() && !controls {
            return Err(Failure::Input(format!(
                "unknown tenant {}: no state under this --prefix (check --prefix, --header and \
                 --header-secret)",
                request.shown
            )));
        }
        if let (Some(scope), Some(id)) = (&request.scope, &scope_id) {
            if !routes.contains(&Some(id.clone())) {
                return Err(Failure::Input(format!(
                    "unknown route {scope:?} for {}: it has state on {}",
                    request.shown,
                    show::routes_text(&routes)
                )));
            }
        }
    }

    let shown = &request.shown;
    let (did, result) = match &request.action {
        Action::Inspect | Action::Limited { .. } => (String::new(), limiter.inspect(target).await),
        Action::SetQuota(quotas) => (
            format!(
                "set-quota: {shown} now uses {} on every instance",
                quotas_text(quotas)
            ),
            limiter.set_quota(target, quotas).await,
        ),
        Action::ClearQuota => (
            format!("clear-quota: {shown} uses its callers' own quotas again"),
            limiter.clear_quota(target).await,
        ),
        Action::Suspend(duration) => (
            format!(
                "suspend: {shown} is denied on every instance for {}",
                show::duration_text(*duration)
            ),
            limiter.suspend(target, *duration).await,
        ),
        Action::Resume => (
            format!("resume: {shown} is no longer suspended"),
            limiter.resume(target).await,
        ),
        Action::Reset => (
            format!("reset: {shown}'s usage is forgotten (an override and a suspension stay)"),
            limiter.reset(target).await,
        ),
    };
    let status = result.map_err(|error| match error {
        ControlError::Quota(e) => {
            Failure::Input(format!("{e} (for --algorithm {})", request.algorithm))
        }
        ControlError::InvalidDuration => Failure::Input(error.to_string()),
        other => in_redis(other.to_string()),
    })?;
    // The status of every route, without --scope (the list names them).
    let mut scoped = Vec::new();
    if request.scope.is_none() {
        for scope in routes.iter().flatten() {
            // A key under the prefix that the limiter never writes (a scope id it would have
            // hashed) holds no state it reads: listed, with no status.
            let Some(route) = Target::stored(&tenant_id, Some(scope)) else {
                continue;
            };
            let status = limiter
                .inspect(route)
                .await
                .map_err(|e| in_redis(e.to_string()))?;
            scoped.push((scope.as_str(), status));
        }
    }
    let storage_key = limiter.storage_key(target);
    if request.json {
        let hashed = (
            StoredKey::is_hashed_id(&tenant_id),
            scope_id.as_deref().is_some_and(StoredKey::is_hashed_id),
        );
        let value = key_json(request, &did, &storage_key, hashed, &status, &scoped);
        return emit(&format!("{value}\n"));
    }
    let mut text = String::new();
    if !did.is_empty() {
        let _ = writeln!(text, "{did}");
    }
    text.push_str(&show::status_text(shown, &storage_key, &status));
    if matches!(request.action, Action::Inspect) && request.scope.is_none() {
        let _ = writeln!(text, "routes: {}", show::routes_text(&routes));
        for (scope, status) in &scoped {
            text.push_str(&show::route_text(scope, status));
        }
    }
    emit(&text)
}

/// Writes `text` to stdout. A reader that has gone (`| head -1`) ends the command quietly, as
/// it ends any filter; another write error is a failure, never a panic.
pub fn emit(text: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Failure::Closed),
        Err(e) => Err(Failure::Store(format!("cannot write the output: {e}"))),
    }
}

/// The fleet's limiter on `store`: its prefix, `algorithm`.
fn limiter(
    store: &RedisStore,
    request: &Request,
    algorithm: redlimit::Algorithm,
) -> Result<Limiter, Failure> {
    let prefix = request.prefix.as_deref().unwrap_or(DEFAULT_PREFIX);
    Limiter::builder(store.clone())
        .algorithm(algorithm)
        .prefix(prefix)
        .build()
        .map_err(|e| Failure::Input(e.to_string()))
}

/// The ids of `key` and of `scope` as the store holds them (`#` and a SHA-256 when hashed): an
/// argument that is already a hashed id (`#` and 64 lower-case hex digits) is taken as one. No
/// key is stored as such an argument (the limiter hashes every key that starts with `#`), so
/// this names only the key stored under that id; a key that is itself `#` and 64 hex digits is
/// named by its own stored form.
fn stored_ids(limiter: &Limiter, key: &str, scope: Option<&str>) -> (String, Option<String>) {
    let tenant = if StoredKey::is_hashed_id(key) {
        key.to_owned()
    } else {
        match limiter.stored_key(&limiter.storage_key(key)) {
            Some(StoredKey::Route { id, .. }) => id.to_owned(),
            _ => unreachable!("a limiter reads its own storage keys"),
        }
    };
    let scope = scope.map(|scope| {
        if StoredKey::is_hashed_id(scope) {
            return scope.to_owned();
        }
        match limiter.stored_key(&limiter.storage_key(Target::scoped(scope, "t"))) {
            Some(StoredKey::Route {
                scope: Some(id), ..
            }) => id.to_owned(),
            _ => unreachable!("a limiter reads its own storage keys"),
        }
    });
    (tenant, scope)
}

/// The key's status as one JSON object: what was done (a control), the key, its status (the
/// route `--scope` names, else the unscoped key) and, without `--scope`, every route where the
/// tenant has state; whether the tenant and the route are stored hashed (`hashed`,
/// `route_hashed`: `storage_key` and the routes show them as `#` and the SHA-256).
fn key_json(
    request: &Request,
    did: &str,
    storage_key: &str,
    (hashed, route_hashed): (bool, bool),
    status: &KeyStatus,
    routes: &[(&str, KeyStatus)],
) -> Value {
    let mut object = serde_json::Map::new();
    if !did.is_empty() {
        object.insert("done".into(), json!(did));
    }
    object.insert("tenant".into(), json!(request.given));
    object.insert("key".into(), json!(request.key));
    object.insert("storage_key".into(), json!(storage_key));
    object.insert("route".into(), json!(request.scope));
    object.extend(show::status_json(status));
    let routes: Vec<Value> = routes
        .iter()
        .map(|(scope, status)| {
            let mut route = serde_json::Map::new();
            route.insert("route".into(), json!(scope));
            route.extend(show::status_json(status));
            // After the fields of a name that is not hashed, which keep their places.
            route.insert("hashed".into(), json!(StoredKey::is_hashed_id(scope)));
            Value::Object(route)
        })
        .collect();
    // After the fields of a name that is not hashed, which keep their places (`routes` last).
    object.insert("hashed".into(), json!(hashed));
    object.insert("route_hashed".into(), json!(route_hashed));
    object.insert("routes".into(), Value::Array(routes));
    Value::Object(object)
}

/// The routes where the tenant (stored as `tenant_id`) has state, by a bounded `SCAN` of its
/// keys: `None` for the unscoped key, `Some(scope)` for each scope, by its id as stored (`#`
/// and a SHA-256 when hashed); and whether its tenant's controls exist.
async fn tenant_routes(
    connection: &Connection,
    limiter: &Limiter,
    target: Target<'_>,
    tenant_id: &str,
) -> Result<(Vec<Option<String>>, bool), String> {
    let (mut routes, mut controls) = (Vec::new(), false);
    for key in connection.scan(&limiter.tenant_pattern(target)).await? {
        // The pattern may match other tenants' keys: only this id's count.
        let route = match limiter.stored_key(&key) {
            Some(StoredKey::Tenant { id }) if id == tenant_id => {
                controls = true;
                continue;
            }
            Some(StoredKey::Route { id, scope } | StoredKey::LogControls { id, scope })
                if id == tenant_id =>
            {
                scope.map(str::to_owned)
            }
            _ => continue,
        };
        if !routes.contains(&route) {
            routes.push(route);
        }
    }
    routes.sort();
    Ok((routes, controls))
}

/// One row of `limited`: a tenant's constrained route, or its own suspension.
struct Limited {
    tenant: String,
    route: String,
    remaining: u64,
    limit: u64,
    reset_after: Duration,
    suspended: Option<Duration>,
    quota_override: Option<Quotas>,
}

/// A tenant's own row (its suspension of every route).
const EVERY_ROUTE: &str = "(every route)";

/// `limited`: a bounded `SCAN` of the limiter's keys, then a peek (cost 0, nothing written) at
/// every route whose quotas are known (a derived scope names them; a route's override too)
/// and a look at every tenant's suspension. On a Cluster it scans every master.
async fn limited(
    connection: &Connection,
    request: &Request,
    limiter: &Limiter,
    store: &RedisStore,
) -> Result<Vec<Limited>, String> {
    let mut found = Vec::new();
    for key in connection.scan(&limiter.key_pattern()).await? {
        // Every id as stored: a hashed one (`#` and a SHA-256) is listed, and named, as such.
        // The shared key of requests without one (`#:`) is no tenant.
        match limiter.stored_key(&key) {
            Some(StoredKey::Tenant { id }) if Target::stored(id, None).is_some() => {
                found.push((id.to_owned(), None));
            }
            Some(StoredKey::Route { id, scope }) if Target::stored(id, scope).is_some() => {
                found.push((id.to_owned(), Some(scope.map(str::to_owned))));
            }
            _ => {}
        }
    }
    found.sort();
    found.dedup();
    let mut rows = Vec::new();
    for (tenant, route) in found {
        let Some(route) = route else {
            // The tenant's controls: a suspension of every route.
            let status = limiter
                .inspect(stored_target(&tenant, None)?)
                .await
                .map_err(|e| e.to_string())?;
            if let Some(left) = status.suspended_for {
                rows.push(Limited {
                    tenant,
                    route: EVERY_ROUTE.to_owned(),
                    remaining: 0,
                    limit: 0,
                    reset_after: left,
                    suspended: Some(left),
                    quota_override: status.all_routes_override,
                });
            }
            continue;
        };
        let target = stored_target(&tenant, route.as_deref())?;
        let status = limiter.inspect(target).await.map_err(|e| e.to_string())?;
        let known = route.as_deref().and_then(scope_quotas);
        let (algorithm, quotas) = match (&status.quota_override, known) {
            (Some(over), known) => (known.map_or(request.algorithm, |(a, _)| a), *over),
            (None, Some(known)) => known,
            (None, None) => continue,
        };
        let peeker = self::limiter(store, request, algorithm).map_err(|e| format!("{e:?}"))?;
        let decision = peeker.check_quotas(target, &quotas, 0).await;
        let Some(decision) = decision.decision().copied() else {
            continue;
        };
        let suspended = decision.suspended.then_some(decision.retry_after);
        if suspended.is_some() || decision.remaining * 10 < decision.limit {
            rows.push(Limited {
                tenant,
                route: route.unwrap_or_else(|| "(unscoped)".to_owned()),
                remaining: decision.remaining,
                limit: decision.limit,
                reset_after: decision.reset_after,
                suspended,
                quota_override: status.quota_override,
            });
        }
    }
    Ok(by_constraint(rows))
}

/// The route of stored ids (checked when the store was read).
fn stored_target<'a>(id: &'a str, scope: Option<&'a str>) -> Result<Target<'a>, String> {
    Target::stored(id, scope).ok_or_else(|| format!("not an id the limiter stores: {id}"))
}

/// What `limited` prints: the rows as text, one a line, or a JSON array on one line.
fn limited_text(json: bool, rows: &[Limited]) -> String {
    let mut text = String::new();
    if json {
        let rows: Vec<Value> = rows
            .iter()
            .map(|row| {
                json!({
                    "tenant": row.tenant,
                    "route": row.route,
                    "remaining": row.remaining,
                    "limit": row.limit,
                    "reset_after_ms": row.reset_after.as_millis() as u64,
                    "suspended_ms": row.suspended.map(|s| s.as_millis() as u64),
                    "override": row.quota_override.as_ref().map(quotas_text),
                    "hashed": StoredKey::is_hashed_id(&row.tenant),
                    "route_hashed": StoredKey::is_hashed_id(&row.route),
                })
            })
            .collect();
        let _ = writeln!(text, "{}", Value::Array(rows));
        return text;
    }
    if rows.is_empty() {
        let _ = writeln!(text, "no key is denied or under 10 % left");
    }
    for row in rows {
        let over = row
            .quota_override
            .as_ref()
            .map_or(String::new(), |q| format!(" (override {})", quotas_text(q)));
        let _ = match row.suspended {
            Some(left) => writeln!(
                text,
                "{} {}: suspended, {} left{over}",
                show::printable(&row.tenant),
                show::printable(&row.route),
                seconds_text(left)
            ),
            None => writeln!(
                text,
                "{} {}: {} of {} left, full again in {}{over}",
                show::printable(&row.tenant),
                show::printable(&row.route),
                row.remaining,
                row.limit,
                seconds_text(row.reset_after)
            ),
        };
    }
    text
}

/// `limited --watch`: the list again every `interval` until Ctrl-C (or until its reader has
/// gone). On a terminal each refresh replaces the last (the screen is cleared); otherwise each
/// starts with its heading line, so a script reads one refresh after the other.
async fn watch_limited(
    connection: &Connection,
    request: &Request,
    limiter: &Limiter,
    store: &RedisStore,
    interval: Duration,
    in_redis: impl Fn(String) -> Failure,
) -> Result<(), Failure> {
    let terminal = std::io::stdout().is_terminal();
    let every = show::duration_text(interval);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    // `ctrl_c` installs its handler when first polled: polled now, before the first list is
    // written, a Ctrl-C right after that list ends the watch with 0 instead of killing it.
    tokio::select! {
        biased;
        _ = &mut interrupted => return Ok(()),
        () = std::future::ready(()) => {}
    }
    for refresh in 1u64.. {
        let rows = limited(connection, request, limiter, store)
            .await
            .map_err(&in_redis)?;
        let mut text = String::new();
        if terminal {
            // Clear the screen and go home: the new list replaces the last one.
            text.push_str("\x1b[2J\x1b[H");
        }
        if !request.json {
            let _ = writeln!(text, "refresh {refresh}, every {every} (Ctrl-C to stop)");
        }
        text.push_str(&limited_text(request.json, &rows));
        emit(&text)?;
        tokio::select! {
            _ = &mut interrupted => return Ok(()),
            () = tokio::time::sleep(interval) => {}
        }
    }
    Ok(())
}

/// The rows tenant by tenant, the most constrained tenant first: by its most constrained row
/// (suspended, longest first, in whole ms; then the least share left), ties by name. Within a
/// tenant, its own row first, then its routes by name: an order no clock can flip, although
/// the tenant's row and a suspended route's row are read at different moments.
fn by_constraint(rows: Vec<Limited>) -> Vec<Limited> {
    let mut tenants: BTreeMap<String, Vec<Limited>> = BTreeMap::new();
    for row in rows {
        tenants.entry(row.tenant.clone()).or_default().push(row);
    }
    let mut groups: Vec<Vec<Limited>> = tenants.into_values().collect();
    for group in &mut groups {
        group.sort_by(|a, b| {
            (b.route == EVERY_ROUTE)
                .cmp(&(a.route == EVERY_ROUTE))
                .then_with(|| a.route.cmp(&b.route))
        });
    }
    // Every group holds a row; the `BTreeMap` already ordered them by name (a stable sort).
    fn most(group: &[Limited]) -> Option<&Limited> {
        group.iter().min_by(|a, b| more_constrained(a, b))
    }
    groups.sort_by(|a, b| match (most(a), most(b)) {
        (Some(a), Some(b)) => more_constrained(a, b),
        _ => Ordering::Equal,
    });
    groups.into_iter().flatten().collect()
}

/// Which of two rows is more constrained: a suspension (the longer in whole ms: a peek's
/// `retry_after` is rounded up, a tenant's time left is exact), then the smaller share left.
fn more_constrained(a: &Limited, b: &Limited) -> Ordering {
    let ms = |d: &Option<Duration>| d.map(|d| d.as_micros().div_ceil(1000));
    let share =
        |row: &Limited, other: &Limited| u128::from(row.remaining) * u128::from(other.limit.max(1));
    ms(&b.suspended)
        .cmp(&ms(&a.suspended))
        .then_with(|| share(a, b).cmp(&share(b, a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tenant: &str, route: &str, remaining: u64, suspended_ms: Option<u64>) -> Limited {
        Limited {
            tenant: tenant.to_owned(),
            route: route.to_owned(),
            remaining,
            limit: 10,
            reset_after: Duration::from_secs(60),
            suspended: suspended_ms.map(Duration::from_millis),
            quota_override: None,
        }
    }

    /// A tenant's rows keep their order whatever the times left: its own row first, then its
    /// routes by name, even when a route's suspension reads a millisecond longer.
    #[test]
    fn a_tenants_own_row_comes_first_whatever_the_times_left() {
        let rows = vec![
            row("low", "b", 1, None),
            row("low", "a", 0, None),
            row("held", "z", 0, Some(59_971)),
            row("held", EVERY_ROUTE, 0, Some(59_970)),
            row("long", EVERY_ROUTE, 0, Some(300_000)),
        ];
        let order: Vec<(String, String)> = by_constraint(rows)
            .into_iter()
            .map(|row| (row.tenant, row.route))
            .collect();
        let want = [
            ("long", EVERY_ROUTE),
            ("held", EVERY_ROUTE),
            ("held", "z"),
            ("low", "a"),
            ("low", "b"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(t, r)| (t.to_string(), r.to_string()))
            .collect();
        assert_eq!(order, want);
    }
}

//! Extending: confirm the own node on the server, then move its TTL.
//!
//! The server-side bound of a ZooKeeper lock is the session, which the client library renews by
//! itself; an extend cannot and need not lengthen it. What an extend moves is the TTL the keeper
//! enforces on the client. It first checks that the node still exists in this session (a lost
//! session or a deleted node is reported as expired, never revived), then sets the node's
//! deletion to `sent + ttl`.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{Extension, LeaseRef};
use dlock_core::{Error, Result};
use tokio::time::Instant;

use crate::client::Inner;
use crate::error::BACKEND;
use crate::naming::owner_prefix;
use crate::recipe::{standing_in, Standing};
use crate::request::read;

/// Moves the TTL of `lease`'s lock to `ttl` from now, if this owner still holds it.
pub(crate) async fn extend(
    inner: &Arc<Inner>,
    lease: &LeaseRef<'_>,
    ttl: Duration,
) -> Result<Extension> {
    let places = [(
        inner.parent_path(lease.key),
        owner_prefix(inner.config.naming, lease.owner),
    )];
    extend_in(inner, lease, ttl, &places).await
}

/// Extends `lease`, looking for a node this client holds no lease for in `places` (parents and
/// the name prefixes of the owner's nodes in them; see [`standing_in`]).
pub(crate) async fn extend_in(
    inner: &Arc<Inner>,
    lease: &LeaseRef<'_>,
    ttl: Duration,
    places: &[(String, String)],
) -> Result<Extension> {
    let sent = Instant::now();
    let until = sent + inner.config.operation_timeout;
    let owner = lease.owner.as_u128();
    let held = inner
        .registry()
        .get(owner)
        .map(|h| (h.path.clone(), h.generation, h.delete_at));
    let Some((path, generation, delete_at)) = held else {
        if inner.registry().retired(owner) {
            return Ok(Extension::Expired);
        }
        return not_held_here(inner, places, until).await;
    };
    if sent >= delete_at {
        // The keeper deletes it now; an extend never revives a lock.
        return Ok(Extension::Expired);
    }
    let session = inner.open_session(until).await?;
    if session.generation != generation {
        if let Some(held) = inner.registry().remove(owner) {
            held.end();
        }
        return Ok(Extension::Expired);
    }
    let stat = match read(inner, &session, until, |c| c.check_stat(&path)).await {
        Ok(stat) => stat,
        // The session ended under the lease: the node is gone with it.
        Err(f) if f.session_ended() => None,
        Err(f) => return Err(f.into_error("check the lock node")),
    };
    match stat {
        Some(stat) if stat.ephemeral_owner == session.id => {
            let re_armed = inner
                .registry()
                .re_arm(owner, &path, Instant::now(), sent + ttl)
                .map(|held| held.publish(session.link(), session.vouched_until()))
                .is_some();
            // A shorter TTL may have moved the earliest deadline forward.
            inner.keeper.notify_one();
            Ok(if re_armed {
                Extension::Extended
            } else {
                Extension::Expired
            })
        }
        _ => {
            if let Some(held) = inner.registry().remove(owner) {
                held.end();
            }
            Ok(Extension::Expired)
        }
    }
}

/// The answer for an owner this client does not hold a lock for.
async fn not_held_here(
    inner: &Arc<Inner>,
    places: &[(String, String)],
    until: Instant,
) -> Result<Extension> {
    let session = inner.open_session(until).await?;
    let found = standing_in(inner, &session, places, until).await;
    match found.map_err(|f| f.into_error("list the lock's queue"))? {
        Standing::Expired => Ok(Extension::Expired),
        // The node exists, but its TTL is kept by the client that took it.
        Standing::Queued(_) => Err(Error::Unsupported {
            backend: BACKEND,
            what: "extending a lease through another client than the one that acquired it",
        }),
        Standing::TakenOver => Ok(Extension::TakenOver),
    }
}

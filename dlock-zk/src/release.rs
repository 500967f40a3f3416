//! Releasing: delete the own node, found by the registry or, for an acquire that never became a
//! lease here, by its owner prefix.
//!
//! Deleting by path never touches another owner's lock (the name embeds the owner token), so
//! ownership needs no separate check. A delete whose reply is lost is repeated; a node that is
//! already gone means the lease ended before (TTL, session expiry).

use std::sync::Arc;

use dlock_core::backend::LeaseRef;
use dlock_core::{Released, Result};
use tokio::time::Instant;

use crate::client::Inner;
use crate::keeper::delete_in_background;
use crate::naming::owner_prefix;
use crate::recipe::{delete_node, standing_in, Deletion, Standing};

/// Releases `lease`'s lock if this owner still holds it.
pub(crate) async fn release(inner: &Arc<Inner>, lease: &LeaseRef<'_>) -> Result<Released> {
    let places = [(
        inner.parent_path(lease.key),
        owner_prefix(inner.config.naming, lease.owner),
    )];
    release_in(inner, lease, &places).await
}

/// Releases `lease`, looking for a node this client holds no lease for in `places` (parents and
/// the name prefixes of the owner's nodes in them; see [`standing_in`]).
pub(crate) async fn release_in(
    inner: &Arc<Inner>,
    lease: &LeaseRef<'_>,
    places: &[(String, String)],
) -> Result<Released> {
    let until = Instant::now() + inner.config.operation_timeout;
    let session = inner.open_session(until).await?;
    // Removed only now: a release that cannot reach the server leaves the TTL in force. Removed
    // before the delete, so that the node's watch does not take the delete for someone else's.
    let held = inner.registry().remove(lease.owner.as_u128());
    if let Some(held) = held {
        if held.generation != session.generation {
            // Its session ended, and the server removed the node with it.
            return Ok(Released::Expired);
        }
        // Kept until the delete is answered: the watch has fired by then (the server notifies
        // before it answers), and stopping it costs no request to remove it.
        let deleted = delete_node(inner, &session, &held.path, until).await;
        let path = held.path.clone();
        drop(held);
        return match deleted {
            Ok(Deletion::Deleted | Deletion::Gone) => Ok(Released::Released),
            Ok(Deletion::Missing) => Ok(Released::Expired),
            // The session ended under the lease: the server removed the node with it.
            Err(f) if f.session_ended() => Ok(Released::Expired),
            Err(f) => {
                // Keep trying while the session lives; the caller may retry too.
                delete_in_background(inner.clone(), session.generation, path);
                Err(f.into_error("delete the lock node"))
            }
        };
    }
    // Not held here: an acquire that was abandoned before it became a lease, a lease whose TTL
    // ran out, or an owner token of another client.
    let found = standing_in(inner, &session, places, until).await;
    let path = match found.map_err(|f| f.into_error("list the lock's queue"))? {
        Standing::Expired => return Ok(Released::Expired),
        Standing::Queued(path) => path,
        Standing::TakenOver => return Ok(Released::TakenOver),
    };
    // A lease whose TTL ran out a moment ago: its node is on its way out, and the lease ended
    // before this release.
    let retired = inner.registry().retired(lease.owner.as_u128());
    match delete_node(inner, &session, &path, until).await {
        Ok(_) if retired => Ok(Released::Expired),
        Ok(Deletion::Deleted | Deletion::Gone) => Ok(Released::Released),
        Ok(Deletion::Missing) => Ok(Released::Expired),
        Err(f) if f.session_ended() => Ok(Released::Expired),
        Err(f) => Err(f.into_error("delete the lock node")),
    }
}

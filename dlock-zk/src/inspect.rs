//! A read-only look at a lock: the lowest contender node and its creation zxid, the holder's
//! fencing token.

use std::sync::Arc;

use dlock_core::{FencingToken, Holder, Holding, LockKey, Result};
use tokio::time::Instant;

use crate::client::Inner;
use crate::naming::queue;
use crate::recipe::list_queue;
use crate::request::read;

/// How often the look is repeated when the holder's node vanishes between the listing and the
/// read of its creation zxid (it released, and the next contender may hold the lock now).
const ATTEMPTS: usize = 3;

/// Lists the lock's queue and reads the first contender's creation zxid; nothing is written.
pub(crate) async fn holding(inner: &Arc<Inner>, key: &LockKey) -> Result<Holding> {
    let until = Instant::now() + inner.config.operation_timeout;
    let session = inner.open_session(until).await?;
    let parent = inner.parent_path(key);
    for _ in 0..ATTEMPTS {
        let children = list_queue(inner, &session, &parent, until)
            .await
            .map_err(|f| f.into_error("list the lock's queue"))?;
        let Some(first) = queue(&children).first().map(|c| c.name.to_owned()) else {
            return Ok(Holding::Free);
        };
        let path = format!("{parent}/{first}");
        let stat = read(inner, &session, until, |c| c.check_stat(&path))
            .await
            .map_err(|f| f.into_error("read the holder's node"))?;
        if let Some(stat) = stat {
            let mut holder = Holder::new();
            holder.fencing = u64::try_from(stat.czxid).ok().map(FencingToken);
            return Ok(Holding::Held(holder));
        }
    }
    // Every listing showed a holder, but each one was gone a moment later: the lock is busy
    // changing hands, and which token holds it right now cannot be told.
    Ok(Holding::Held(Holder::new()))
}

//! One task per session: follows the client library's session states and tells the leases, and
//! while leases are held, probes the session so that its bound keeps moving.
//!
//! The library pings the server by itself but does not say when a ping was answered, so the
//! backend cannot see that the session is confirmed. A probe — an `exists` on `/`, a read the
//! connected server answers locally — every quarter of the session timeout gives it that
//! confirmation while it matters, and costs nothing while no lock is held.

use std::future::Future;
use std::pin::Pin;
use std::sync::Weak;

use tokio::time::Instant;
use zookeeper_client as zk;

use crate::client::WeakInner;
use crate::request::call;
use crate::session::{link_of, Link, Session};
use crate::stats::Counters;

type Probe = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs until the session ends or the backend or session is dropped.
pub(crate) async fn run(inner: WeakInner, session: Weak<Session>, mut states: zk::StateWatcher) {
    let mut probe: Option<Probe> = None;
    let mut next_probe = Instant::now();
    loop {
        let interval = match session.upgrade() {
            Some(s) => s.timeout / 4,
            None => return,
        };
        tokio::select! {
            state = states.changed() => {
                let (Some(inner), Some(session)) = (inner.upgrade(), session.upgrade()) else {
                    return;
                };
                let link = link_of(state);
                if !session.set_link(link) {
                    continue;
                }
                tracing::debug!(
                    backend = crate::error::BACKEND,
                    session = %format_args!("{:#x}", session.id),
                    ?state,
                    "ZooKeeper session state changed"
                );
                match link {
                    Link::Ended => {
                        inner.end_session(&session);
                        return;
                    }
                    Link::Connected => {
                        // Confirm the resumed session soon rather than a whole interval later.
                        next_probe = Instant::now();
                        inner.announce(&session);
                    }
                    Link::Disconnected => inner.announce(&session),
                }
            }
            _ = tokio::time::sleep_until(next_probe), if probe.is_none() => {
                next_probe = Instant::now() + interval;
                let (Some(inner), Some(session)) = (inner.upgrade(), session.upgrade()) else {
                    return;
                };
                if session.link() == Link::Connected && inner.holds_in(session.generation) {
                    Counters::bump(&inner.counters.probes);
                    let until = Instant::now() + interval;
                    probe = Some(Box::pin(async move {
                        // Success confirms the session inside `call`; failures show in the link.
                        let _ = call(&inner, &session, until, |c| c.check_stat("/")).await;
                    }));
                }
            }
            _ = async {
                match probe.as_mut() {
                    Some(p) => p.await,
                    None => std::future::pending().await,
                }
            }, if probe.is_some() => {
                probe = None;
            }
        }
    }
}

//! The futures an application awaits stay small, whatever backends are compiled in: `connect`
//! boxes each backend's connect, so a `main` that awaits it beside other work needs no
//! `recursion_limit` and no large stack frame.

use std::mem::size_of_val;
use std::time::Duration;

use dlock::LockOptions;

/// The most any of these futures may take.
const MOST: usize = 1024;

#[tokio::test]
async fn connect_acquire_try_acquire_and_release_futures_are_small() {
    let connecting = dlock::connect("memory://");
    let connect = size_of_val(&connecting);
    let locks = connecting.await.expect("memory:// connects");
    let opts = LockOptions::new(Duration::from_secs(10));
    let acquire = size_of_val(&locks.acquire("k", &opts));
    let try_acquire = size_of_val(&locks.try_acquire("k", &opts));
    let lease = locks.acquire("k", &opts).await.expect("a free key");
    let release = {
        let releasing = lease.release();
        let size = size_of_val(&releasing);
        releasing.await.expect("released");
        size
    };
    println!(
        "future sizes: connect {connect} B, acquire {acquire} B, try_acquire {try_acquire} B, \
         release {release} B"
    );
    for (name, size) in [
        ("connect", connect),
        ("acquire", acquire),
        ("try_acquire", try_acquire),
        ("release", release),
    ] {
        assert!(
            size <= MOST,
            "{name}'s future is {size} bytes (at most {MOST})"
        );
    }
}

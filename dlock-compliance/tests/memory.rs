//! The whole suite against the in-process backend, held as `Arc<dyn>` and as `Box<dyn>`.

use std::sync::Arc;

use async_trait::async_trait;
use dlock_compliance::suite;
use dlock_compliance::{Inspect, Subject};
use dlock_core::{DistributedLock, InMemoryLock};

struct Entries(InMemoryLock);

#[async_trait]
impl Inspect for Entries {
    async fn stored(&self, namespace: &str) -> anyhow::Result<u64> {
        Ok(self
            .0
            .keys()
            .iter()
            .filter(|k| k.starts_with(namespace))
            .count() as u64)
    }
}

/// Cases run at once unless `--test-threads` says otherwise. In process, a case spends its time
/// waiting on its timers (TTLs, waits), not computing: the binary took 68 s with one case per
/// core and 22 s with 16 at once, with under a second of CPU either way.
const CASES_AT_ONCE: usize = 16;

fn main() {
    let mut args = libtest_mimic::Arguments::from_args();
    args.test_threads.get_or_insert(CASES_AT_ONCE);
    let service = InMemoryLock::new();
    let capabilities = service.capabilities();

    let shared = service.clone();
    let as_arc = Subject::new("memory/arc", capabilities, move || {
        let client: Arc<dyn DistributedLock> = Arc::new(shared.clone());
        async move { Ok(client) }
    })
    .with_inspect(Arc::new(Entries(service.clone())));

    let shared = service.clone();
    let as_box = Subject::new("memory/box", capabilities, move || {
        let boxed: Box<dyn DistributedLock> = Box::new(shared.clone());
        let client: Arc<dyn DistributedLock> = Arc::new(boxed);
        async move { Ok(client) }
    })
    .with_inspect(Arc::new(Entries(service.clone())));

    let mut trials = suite::trials(&as_arc);
    trials.extend(suite::trials(&as_box));
    libtest_mimic::run(&args, trials).exit();
}

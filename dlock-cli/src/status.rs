//! `dlock status`: held or free, read without taking the lock.

use dlock::{DistributedLockExt, Error, Holding};

use crate::args::Target;
use crate::exit::{self, Failure};

/// Prints the lock's state and returns the exit code that says it.
pub async fn status(target: Target) -> Result<u8, Failure> {
    let locks = dlock::connect(&target.url).await?;
    let key = target.key.as_str();
    match locks.holding(key).await {
        Ok(Holding::Free) => {
            println!("{key}: free");
            Ok(exit::FREE)
        }
        Ok(Holding::Unknown) => {
            println!("{key}: unknown (the servers that answered disagree on who holds it)");
            Ok(exit::UNKNOWN)
        }
        Ok(held) => {
            println!("{key}: {held}");
            Ok(exit::BUSY)
        }
        Err(Error::Unsupported { backend, .. }) => {
            println!("{key}: unknown (the {backend} backend cannot tell without taking the lock)");
            Ok(exit::UNKNOWN)
        }
        Err(e) => Err(e.into()),
    }
}

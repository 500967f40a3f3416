//! `dlock status`: who holds a lock and who waits for it, read without taking the lock.

use dlock::{Error, Holding};

use crate::args::StatusArgs;
use crate::exit::{self, Failure};
use crate::view::{held_lines, LockView};

/// Prints the lock's state and returns the exit code that says it.
pub async fn status(args: StatusArgs, trace: bool) -> Result<u8, Failure> {
    let locks = crate::connect(&args.target.url, trace).await?;
    let key = args.target.key.as_str();
    let holding = match locks.holding(key).await {
        Ok(holding) => holding,
        Err(Error::Unsupported { backend, .. }) => {
            println!("{key}: unknown (the {backend} backend cannot tell without taking the lock)");
            return Ok(exit::UNKNOWN);
        }
        Err(e) => return Err(e.into()),
    };
    if args.json {
        println!("{}", LockView::new(key, &holding).json());
    }
    let code = match &holding {
        Holding::Free => exit::FREE,
        Holding::Held(_) => exit::BUSY,
        _ => exit::UNKNOWN,
    };
    if args.json {
        return Ok(code);
    }
    match &holding {
        Holding::Free => println!("{key}: free"),
        Holding::Held(holder) => {
            for line in held_lines(key, holder) {
                println!("{line}");
            }
        }
        _ => println!("{key}: unknown (the servers that answered disagree on who holds it)"),
    }
    Ok(code)
}

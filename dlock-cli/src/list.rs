//! `dlock list`: the held locks under a prefix, with owner, token and age.

use crate::args::ListArgs;
use crate::exit::{self, Failure};
use crate::view::{table, LockView};

/// Prints the held locks (a table, or one JSON array with `--json`).
pub async fn list(args: ListArgs, trace: bool) -> Result<u8, Failure> {
    let locks = crate::connect(&args.url, trace).await?;
    let held = locks.admin().list(&args.prefix).await?;
    if args.json {
        let views: Vec<LockView> = held
            .iter()
            .map(|h| LockView::held(&h.key, &h.holder))
            .collect();
        let json = serde_json::to_string(&views).unwrap_or_default();
        println!("{json}");
    } else {
        let rows: Vec<(&str, &dlock::Holder)> =
            held.iter().map(|h| (h.key.as_str(), &h.holder)).collect();
        for line in table(&rows) {
            println!("{line}");
        }
    }
    Ok(exit::FREE)
}

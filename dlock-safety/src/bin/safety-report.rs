//! `safety-report`: runs the safety matrix and writes it as Markdown and JSON.
//!
//! Exits with status 1 if any cell contradicts its backend's declaration, 2 on bad arguments.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Arg, ArgAction, Command};
use dlock_safety::{matrix, Filter, Plan, Report};
use dlock_testkit::page::{self, Stamp};

fn cli() -> Command {
    Command::new("safety-report")
        .about("Runs every fault scenario on every dlock backend and checks each against what the backend declares")
        .arg(Arg::new("quick").long("quick").action(ArgAction::SetTrue).help("the shortened CI run"))
        .arg(Arg::new("out").long("out").value_name("DIR").value_parser(clap::value_parser!(PathBuf))
            .help("write safety-matrix.md, safety-details.md and safety-report.json into DIR"))
        .arg(Arg::new("page").long("page").value_name("FILE").value_parser(clap::value_parser!(PathBuf))
            .help("replace the matrix section of FILE (between its safety-matrix markers) with this run's, stamped with its command, date, commit and machine"))
        .arg(Arg::new("only").long("only").value_name("SCENARIO/BACKEND").action(ArgAction::Append)
            .help("run only these cells, e.g. 2/redis, */zk, 8/*, 5 or etcd (repeatable)"))
        .after_help("Servers: containers by default (Docker, images from scripts/test-images); \
                     DLOCK_TEST_REDIS_URL, DLOCK_TEST_REDLOCK_URLS, DLOCK_TEST_ZK_URL, DLOCK_TEST_ETCD_URL and DLOCK_TEST_POSTGRES_URL select your own \
                     servers instead, where scenarios that break servers are reported as not run.")
}

fn main() -> ExitCode {
    let args = cli().get_matches();
    let plan = if args.get_flag("quick") {
        Plan::quick()
    } else {
        Plan::full()
    };
    let mut filter = Filter::default();
    for selector in args.get_many::<String>("only").into_iter().flatten() {
        if let Err(e) = filter.add(selector) {
            eprintln!("safety-report: {e}");
            return ExitCode::from(2);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("safety-report: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = std::time::Instant::now();
    let cells = runtime.block_on(matrix::run(plan, &filter));
    drop(runtime);
    let report = Report::new(plan, &cells);
    let matrix = report.matrix();
    println!("{matrix}");
    if let Err(e) = write_outputs(&args, &report, &matrix) {
        eprintln!("safety-report: {e}");
        return ExitCode::FAILURE;
    }
    let mismatches = report.mismatches();
    eprintln!(
        "safety-report: {} cells ({} run) in {:.0} s, {} contradicting their declaration",
        cells.len(),
        cells.iter().filter(|c| c.ran()).count(),
        started.elapsed().as_secs_f64(),
        mismatches.len()
    );
    if mismatches.is_empty() {
        ExitCode::SUCCESS
    } else {
        for m in mismatches {
            eprintln!("  ✗ {m}");
        }
        ExitCode::FAILURE
    }
}

fn write_outputs(args: &clap::ArgMatches, report: &Report<'_>, matrix: &str) -> Result<(), String> {
    if let Some(dir) = args.get_one::<PathBuf>("out") {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let json = report
            .json()
            .map_err(|e| format!("encoding the JSON: {e}"))?;
        for (name, text) in [
            ("safety-matrix.md", matrix.to_owned()),
            ("safety-details.md", report.details()),
            ("safety-report.json", json),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
        eprintln!("safety-report: wrote {}", dir.display());
    }
    if let Some(path) = args.get_one::<PathBuf>("page") {
        let command = std::iter::once("safety-report".to_owned())
            .chain(std::env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" ");
        page::write_section(path, "safety-matrix", &Stamp::now(command), matrix)?;
        eprintln!("safety-report: rewrote the matrix in {}", path.display());
    }
    Ok(())
}

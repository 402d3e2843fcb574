//! `ciphermq-sim`: runs seeds of the simulation; a failure prints its seed,
//! the steps before it, and how to replay it.

use std::process::ExitCode;

use ciphermq_sim::{run, Options};

const USAGE: &str = "usage: ciphermq-sim [--seed N | --seeds COUNT [--from FIRST]] [--steps N] [--shards 1|2] [--no-faults] [--no-crashes] [--moves] [--full-trace]";

fn main() -> ExitCode {
    let mut opts = Options::default();
    let mut first = 0u64;
    let mut count = 100u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            args.next()
                .ok_or_else(|| format!("{name} needs a number"))?
                .parse()
                .map_err(|e| format!("{name}: {e}"))
        };
        let parsed = match arg.as_str() {
            "--seed" => value("--seed").map(|s| {
                first = s;
                count = 1;
            }),
            "--seeds" => value("--seeds").map(|n| count = n),
            "--from" => value("--from").map(|s| first = s),
            "--steps" => value("--steps").map(|n| opts.steps = n),
            "--shards" => value("--shards").and_then(|n| match n {
                1 | 2 => {
                    opts.shards = Some(n as usize);
                    Ok(())
                }
                _ => Err("--shards: 1 or 2".into()),
            }),
            "--no-faults" => {
                opts.faults = false;
                Ok(())
            }
            "--full-trace" => {
                opts.full_trace = true;
                Ok(())
            }
            "--moves" => {
                opts.moves = true;
                Ok(())
            }
            "--no-crashes" => {
                opts.crashes = false;
                Ok(())
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => Err(format!("unknown argument {other}")),
        };
        if let Err(e) = parsed {
            eprintln!("ciphermq-sim: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    let mut failed = 0u64;
    let (mut crashes, mut forgotten) = (0u64, 0u64);
    let started = std::time::Instant::now();
    for seed in first..first.saturating_add(count) {
        // A failed assertion inside the shard is a finding like a broken
        // invariant: name its seed and go on with the others.
        match std::panic::catch_unwind(|| run(seed, &opts)) {
            Ok(Ok(s)) => {
                crashes += s.crashes;
                forgotten += s.dedup_forgotten;
                if count == 1 {
                    println!("seed {seed}: ok: {s:?}");
                }
            }
            Ok(Err(failure)) => {
                failed += 1;
                eprintln!("{failure}");
            }
            Err(_) => {
                failed += 1;
                let shards = opts.shards.map(|n| format!(" --shards {n}"));
                eprintln!(
                    "seed {seed}: panicked (the message is above)\nreplay: ciphermq-sim --seed {seed}{}",
                    shards.unwrap_or_default()
                );
            }
        }
    }
    println!(
        "{count} seeds from {first}, {} steps each: {failed} failed ({:.1} s); \
         {crashes} crashes, {forgotten} full-disk deletions of acked segments",
        opts.steps,
        started.elapsed().as_secs_f64()
    );
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
